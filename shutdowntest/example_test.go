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
