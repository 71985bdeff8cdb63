package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/examples/config-operator/config"
	"github.com/quiesce-dev/quiesce/examples/config-operator/controller"
	"github.com/quiesce-dev/quiesce/runnable"
)

// The suite runs one control plane and one manager, set up as main sets it up, from the
// config file testdata/config.yaml; the specs share them. AfterSuite stops the manager, as
// SIGTERM would, and fails if quiesce had to abandon a call or one is still running.
var (
	testEnv   *envtest.Environment
	k8sClient client.Client
	store     *configStore
	q         *runnable.Runnable
	stopMgr   context.CancelFunc
	mgrDone   chan error
)

func TestController(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane: skipped with -short")
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	SetDefaultEventuallyTimeout(30 * time.Second) // a loaded machine, -race: not Gomega's 1s
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")

	By("bootstrapping test environment")
	testEnv = &envtest.Environment{}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme.Scheme})
	Expect(err).NotTo(HaveOccurred())
	store = newConfigStore()

	By("starting the manager from the suite's config file, as main does")
	c, err := config.Load(filepath.Join("testdata", "config.yaml"))
	Expect(err).NotTo(HaveOccurred())
	c.PublishURL = store.URL
	mgrOpts, qopts, err := c.Options(scheme.Scheme)
	Expect(err).NotTo(HaveOccurred())
	q, err = runnable.Setup(cfg, &mgrOpts, qopts) // quiesce: as in main
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	Expect(err).NotTo(HaveOccurred())
	Expect(q.Add(mgr)).To(Succeed()) // quiesce: as in main
	Expect((&controller.ConfigMapReconciler{
		Client:    mgr.GetClient(),
		Publisher: &controller.HTTPPublisher{URL: c.PublishURL},
		Executor:  q.Executor(), // quiesce: as in main
	}).SetupWithManager(mgr)).To(Succeed())

	var ctx context.Context
	ctx, stopMgr = context.WithCancel(context.Background())
	mgrDone = make(chan error, 1)
	go func() {
		defer GinkgoRecover()
		mgrDone <- mgr.Start(q.StopContext(ctx))
	}()
})

var _ = AfterSuite(func(ctx SpecContext) {
	if stopMgr != nil {
		By("stopping the manager, as SIGTERM would, while a publish is in flight")
		slow := newConfigMap("slow-1")
		Expect(k8sClient.Create(ctx, slow)).To(Succeed())
		Eventually(q.Executor().Pending).Should(ContainElement(
			HaveField("Name", controller.Name+"/default/slow-1/publish")))
		stopMgr()
		Eventually(q.Executor().Draining()).Should(BeClosed())
		store.release() // the store answers, during the drain
		Eventually(mgrDone).WithTimeout(time.Minute).Should(Receive(Succeed()))

		// quiesce: the drain is over, no call is left running, none was abandoned.
		Eventually(q.Done()).Should(BeClosed())
		Expect(q.Executor()).To(draintest.HaveNoPendingCalls())
		Expect(q.Err()).NotTo(HaveOccurred())
		// The publish in flight at the stop finished, and was recorded.
		Expect(published(ctx, slow)()).To(Equal(controller.Revision(slow.Data)))
	}
	if store != nil {
		store.release()
		store.Close()
	}
	if testEnv != nil {
		By("tearing down the test environment")
		Expect(testEnv.Stop()).To(Succeed())
	}
})
