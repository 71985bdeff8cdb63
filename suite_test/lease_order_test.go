package suite_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/runnable"
)

// ObserveLease must run before ctrl.NewManager: the manager copies its Options, so a lock
// installed afterwards is never used and nothing would fence. Add cannot see that; the
// Runnable observes it once the manager leads.
var _ = Describe("ObserveLease called after ctrl.NewManager", func() {
	const msg = "Leader election does not use the lock of ObserveLease: calls are not fenced on a lost lease"
	lead := func(ns, id string, after bool) *logLines {
		leaderElection := func(o *manager.Options) {
			o.LeaderElection = true
			o.LeaderElectionID = id
			o.LeaderElectionNamespace = ns
			o.LeaderElectionReleaseOnCancel = true
			o.LeaseDuration = ptr.To(4 * time.Second)
			o.RenewDeadline = ptr.To(3 * time.Second)
			o.RetryPeriod = ptr.To(200 * time.Millisecond)
		}
		var mgr manager.Manager
		var opts *manager.Options
		if after { // the mistake: the manager is made first, with its own lock
			mgr = newPlainManager(inNamespace(ns), leaderElection)
			mo, _ := managerOptions.Load(mgr)
			opts = mo.(*manager.Options)
			Expect(runnable.ObserveLease(cfg, opts)).To(Succeed())
		} else {
			mgr = newManager(inNamespace(ns), leaderElection)
		}
		logs := &logLines{}
		q, err := addQuiesce(mgr, runnable.Options{Logger: logs.logger(), GracePeriod: 2 * time.Second})
		Expect(err).NotTo(HaveOccurred(), "Add cannot tell")
		stop, done := startManager(mgr, q)
		Eventually(mgr.Elected(), 20*time.Second).Should(BeClosed())
		if after {
			Eventually(logs.messages).Should(ContainElement(msg))
		}
		stop()
		Expect(<-done).To(Succeed())
		return logs
	}

	It("should log, once the manager leads, that nothing fences, and name the fix", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		logs := lead(ns, "quiesce-late-observe", true)
		Expect(logs.messages()).To(ContainElement(msg))
		Expect(logs.all()).To(ContainElement(ContainSubstring("before ctrl.NewManager(cfg, mgrOpts)")))

		By("a manager made after ObserveLease, in the same way otherwise, logs no such line")
		logs = lead(ns, "quiesce-observed", false)
		Expect(logs.messages()).NotTo(ContainElement(msg))
		expectNoLeaks(cur)
	})
})
