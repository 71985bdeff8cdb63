package shutdowntest_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// testEnv stands for the suite's envtest environment, started in TestMain or BeforeSuite.
var testEnv *envtest.Environment

// A plain testing test of a kubebuilder operator (its main in ./cmd of the module two
// directories up): SIGTERM once three calls are in flight; every one must finish.
func ExampleStart() {
	t := &testing.T{} // the test's *testing.T
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: "./cmd",
		Dir:     "../..",
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
	opts := shutdowntest.Options{Package: "./cmd", Dir: "../..", Env: testEnv, Output: t.Output(),
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
