package shutdowntest_test

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// The package's control plane, for the Ginkgo specs.
var (
	ginkgoEnv    *envtest.Environment
	ginkgoClient client.Client
)

// TestGinkgo runs the harness as a Ginkgo suite uses it: SpecContext, DeferCleanup,
// GinkgoWriter, Eventually on Pending, the matchers.
func TestGinkgo(t *testing.T) {
	ginkgoEnv, ginkgoClient = environment(t)
	RegisterFailHandler(Fail)
	RunSpecs(t, "shutdowntest in a Ginkgo suite")
}

var _ = Describe("shutdowntest", func() {
	It("should let in-flight reconciles finish and exit 0 on SIGTERM", func(ctx SpecContext) {
		opts := demoOptions(ginkgoEnv, "--grace-period=5s", "--cancel-after=4s", "--work=1s")
		opts.Output = GinkgoWriter
		op, err := shutdowntest.Start(ctx, opts)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(op.Kill)

		createConfigMaps(ctx, GinkgoT(), ginkgoClient, "ginkgo", "job-1")
		Eventually(op.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
			Should(BeNumerically(">=", 2))
		res, err := op.Stop(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(res).To(shutdowntest.HaveExitedGracefully())
		Expect(res).To(shutdowntest.HaveLogged("All calls returned"))
		Expect(res.Abandoned).To(BeEmpty())
	})
})
