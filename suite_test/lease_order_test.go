package suite_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/runnable"
)

// runnable.Setup must run before ctrl.NewManager, on the Options given to it: a manager
// made first leads with a lock of its own, and nothing would fence. q.Add cannot see that;
// the Runnable sees it once the manager leads, and mgr.Start returns its error.
var _ = Describe("A manager made before runnable.Setup", func() {
	leaderElection := func(ns, id string) func(*manager.Options) {
		return func(o *manager.Options) {
			o.LeaderElection = true
			o.LeaderElectionID = id
			o.LeaderElectionNamespace = ns
			o.LeaderElectionReleaseOnCancel = true
			o.LeaseDuration = ptr.To(4 * time.Second)
			o.RenewDeadline = ptr.To(3 * time.Second)
			o.RetryPeriod = ptr.To(200 * time.Millisecond)
		}
	}

	It("should fail mgr.Start once the manager leads, naming the fix", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		opts := managerOptions(inNamespace(ns), leaderElection(ns, "quiesce-late-setup"))
		mgr, err := ctrl.NewManager(cfg, opts) // the mistake: the manager first, with its own lock
		Expect(err).NotTo(HaveOccurred())
		q, err := runnable.Setup(cfg, &opts, runnable.Options{GracePeriod: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred())
		Expect(q.Add(mgr)).To(Succeed(), "Add cannot tell")
		_, done := startManager(mgr, q)
		Eventually(done, 20*time.Second).Should(Receive(MatchError(ContainSubstring(
			"the manager leads without the lease lock of runnable.Setup"))))

		By("a manager made after Setup, in the same way otherwise, leads and stops cleanly")
		mgr, q, err = newQuiesced(runnable.Options{GracePeriod: 2 * time.Second},
			inNamespace(ns), leaderElection(ns, "quiesce-setup-first"))
		Expect(err).NotTo(HaveOccurred())
		stop, done := startManager(mgr, q)
		Eventually(mgr.Elected(), 20*time.Second).Should(BeClosed())
		stop()
		Eventually(done, 20*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})
})
