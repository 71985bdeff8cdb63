package shutdowntest_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// testEnv stands for the suite's envtest environment, started in TestMain or BeforeSuite.
var testEnv *envtest.Environment

// The operator's main package, and the module's root from the test's directory.
const (
	operatorPackage = "./cmd"
	moduleRoot      = "../.."
)

// createObject stands for a create of one of the operator's objects, named after i, through
// the API server (e.g. k8sClient.Create): an admission request to its webhooks.
func createObject(context.Context, int) error { return nil }

// A plain testing test of a kubebuilder operator (its main in ./cmd of the module two
// directories up): SIGTERM once three calls are in flight; every one must finish.
func ExampleStart() {
	t := &testing.T{} // the test's *testing.T
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: operatorPackage,
		Dir:     moduleRoot,
		Env:     testEnv,
		Args:    []string{"--leader-elect=false"},
		Output:  t.Output(),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	// ... create the objects whose reconciles must survive the stop, then:
	g.Eventually(op.PendingCount).WithContext(t.Context()).WithTimeout(time.Minute).Should(BeNumerically(">=", 3))
	res, err := op.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	t.Logf("exit code %d, %s after SIGTERM, %d log lines", res.ExitCode, res.Took, len(res.Lines))
}

// Two replicas with leader election, their metrics served over HTTPS with authentication
// (kubebuilder's default): the calls in flight on the leader, then the handover.
func ExampleOperator_WaitLeader() {
	t := &testing.T{} // the test's *testing.T
	g := NewWithT(t)
	opts := shutdowntest.Options{Package: operatorPackage, Dir: "../..", Env: testEnv, Output: t.Output(),
		LeaderElection: true, MetricsSecure: true, LogPrefix: "leader | "}
	leader, err := shutdowntest.Start(t.Context(), opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(leader.Kill)
	g.Expect(leader.WaitLeader(t.Context())).To(Succeed())
	opts.LogPrefix = "standby | "
	standby, err := shutdowntest.Start(t.Context(), opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(standby.Kill)

	// ... create objects, then:
	g.Eventually(leader.PendingCount).WithContext(t.Context()).WithTimeout(time.Minute).Should(BeNumerically(">=", 1))
	calls, err := leader.PendingCalls(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	for _, c := range calls {
		t.Logf("%s: %s, waiting in %s", c.Name, c.Age, c.Handler)
	}
	res, err := leader.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	g.Expect(standby.WaitLeader(t.Context())).To(Succeed())
}

// A rolling update behind a Service, with admission requests throughout: a new replica, then
// the old leader's stop; no request may fail, and a replica still running takes the lease.
func ExampleNewService() {
	t := &testing.T{} // the test's *testing.T
	g := NewWithT(t)
	svc, err := shutdowntest.NewService(&testEnv.WebhookInstallOptions, shutdowntest.ServiceOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(svc.Close()).To(Succeed()) })
	replica := func(name string) *shutdowntest.Operator {
		op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{Package: operatorPackage, Dir: "../..",
			Env: testEnv, Service: svc, LeaderElection: true, LogPrefix: name + " | ", Output: t.Output(),
			Args: []string{"--quiesce-shutdown-delay=2s"}})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(op.Kill)
		return op
	}
	old := replica("old")
	g.Expect(old.WaitLeader(t.Context())).To(Succeed())
	standby := replica("standby")
	stop := shutdowntest.Every(t.Context(), 20*time.Millisecond, func(ctx context.Context, i int) error {
		return createObject(ctx, i) // an object that your webhooks admit, named after i
	})
	fresh := replica("new")
	g.Expect(old.Stop(t.Context())).To(shutdowntest.HaveExitedGracefully())
	g.Eventually(func() bool { return standby.IsLeader() || fresh.IsLeader() }, time.Minute).Should(BeTrue())
	calls, errs := stop()
	g.Expect(errs).To(BeEmpty())
	t.Logf("%d requests, none failed", calls)
}
