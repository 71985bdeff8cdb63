package controller

import (
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"

	cachev1alpha1 "example.com/memcached/api/v1alpha1"
)

// The operator's own binary (cmd/main.go), run against a control plane that sends Memcached
// admission requests to its webhook (config/webhook), and stopped with SIGTERM.
var _ = Describe("Memcached operator shutdown", func() {
	It("should admit requests through its webhook while it drains, then exit 0", func(ctx SpecContext) {
		By("starting a control plane of its own, with the operator's webhook installed")
		env := &envtest.Environment{
			CRDDirectoryPaths:     testEnv.CRDDirectoryPaths,
			ErrorIfCRDPathMissing: true,
			BinaryAssetsDirectory: testEnv.BinaryAssetsDirectory,
			WebhookInstallOptions: envtest.WebhookInstallOptions{
				Paths: []string{filepath.Join("..", "..", "config", "webhook")},
			},
		}
		cfg, err := env.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(env.Stop)
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		Expect(err).NotTo(HaveOccurred())

		By("starting the operator, its webhook server where the control plane sends requests")
		DeferCleanup(shutdowntest.Cleanup) // removes the binary that Start builds
		op, err := shutdowntest.Start(ctx, shutdowntest.Options{
			Package: "./cmd", Dir: filepath.Join("..", ".."), Env: env, Output: GinkgoWriter,
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(op.Kill) // never leaves a process, whatever fails

		By("sending SIGTERM while a reconcile is in flight (register takes 2s)")
		Expect(c.Create(ctx, newMemcached("busy"))).To(Succeed())
		Eventually(op.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(20 * time.Millisecond).
			Should(BeNumerically(">=", 1))
		var res *shutdowntest.Result
		stopped := make(chan error, 1)
		go func() { // Stop sends SIGTERM, then waits for the exit
			var err error
			res, err = op.Stop(ctx)
			stopped <- err
		}()
		Eventually(op.Lines).WithContext(ctx).WithTimeout(time.Minute).WithPolling(10 * time.Millisecond).
			Should(ContainElement(ContainSubstring("Draining executor")))

		By("creating a Memcached while the operator drains: its webhook admits it")
		Expect(c.Create(ctx, newMemcached("during-stop"))).To(Succeed())
		Expect(op.Done()).NotTo(BeClosed())

		Eventually(stopped).WithContext(ctx).WithTimeout(time.Minute).Should(Receive(Succeed()))
		Expect(res).To(shutdowntest.HaveExitedGracefully())
		Expect(res).To(shutdowntest.HaveLogged(And(
			ContainSubstring("Validation for Memcached upon creation"), ContainSubstring("during-stop"))))
		Expect(res).To(shutdowntest.HaveLogged("All calls returned"))
	})
})

func newMemcached(name string) *cachev1alpha1.Memcached {
	return &cachev1alpha1.Memcached{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
}
