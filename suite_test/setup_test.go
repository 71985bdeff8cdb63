package suite_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/runnable"
)

// setupLease is the lease of the Setup spec's manager.
const setupLease = "quiesce-setup"

// The README's setup, on a real API server: Setup before ctrl.NewManager, q.Add after it.
var _ = Describe("runnable.Setup", func() {
	setupOptions := func(ns, id string) manager.Options {
		return manager.Options{
			Scheme:                 scheme.Scheme,
			Metrics:                metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0",
			Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
			LeaderElection:         true, LeaderElectionID: id, LeaderElectionNamespace: ns,
			LeaderElectionReleaseOnCancel: true,
			LeaseDuration:                 ptr.To(4 * time.Second),
			RenewDeadline:                 ptr.To(3 * time.Second),
			// Renewals 1s apart: a stop that cancels a renewal in flight leaves client-go's lock
			// with a stale resourceVersion, and its release then conflicts (with or without quiesce).
			RetryPeriod: ptr.To(time.Second),
		}
	}

	It("should lead through the observed lock, leave the config as it was, and release the lease", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		mine := rest.CopyConfig(cfg)
		mo := setupOptions(ns, setupLease)
		logs := &logLines{}
		q, err := runnable.Setup(mine, &mo, runnable.Options{Logger: logs.logger(), GracePeriod: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(mine.Timeout).To(BeZero(), "Setup changed the caller's rest.Config")
		mgr, err := ctrl.NewManager(mine, mo)
		Expect(err).NotTo(HaveOccurred())
		Expect(mgr.GetHTTPClient().Timeout).To(BeZero(), "every request of the manager would be cut")
		Expect(q.Add(mgr)).To(Succeed())

		stop, done := startManager(mgr, q)
		Eventually(mgr.Elected(), 20*time.Second).Should(BeClosed())
		var lease coordinationv1.Lease
		Eventually(func() string {
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: setupLease}, &lease); err != nil {
				return ""
			}
			return ptr.Deref(lease.Spec.HolderIdentity, "")
		}).ShouldNot(BeEmpty())
		// The elector renews at once after acquiring: stop between renewals, not during that one.
		Eventually(func() bool {
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: setupLease}, &lease)).To(Succeed())
			return lease.Spec.RenewTime != nil && lease.Spec.AcquireTime != nil &&
				lease.Spec.RenewTime.After(lease.Spec.AcquireTime.Time)
		}).Should(BeTrue())
		stop()
		Expect(<-done).To(Succeed())
		Expect(q.Err()).NotTo(HaveOccurred())
		Expect(logs.messages()).NotTo(ContainElement(ContainSubstring("does not use the lock")))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: setupLease}, &lease)).To(Succeed())
		Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).To(BeEmpty(), "released on cancel")
		expectNoLeaks(cur)
	})

	It("should refuse, at q.Add, Options changed after Setup, naming the fix", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		mo := setupOptions(ns, "quiesce-setup-late")
		q, err := runnable.Setup(cfg, &mo, runnable.Options{GracePeriod: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		mo.LeaderElectionResourceLockInterface = nil // controller-runtime's own lock: nothing would fence
		mgr, err := ctrl.NewManager(cfg, mo)
		Expect(err).NotTo(HaveOccurred())
		Expect(q.Add(mgr)).To(MatchError(ContainSubstring("changed after runnable.Setup: call Setup once mgrOpts is complete")))
	})
})
