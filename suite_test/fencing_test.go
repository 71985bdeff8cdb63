package suite_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// Fencing from the lease itself (issue 28): the context of every call quiesce keeps
// alive ends no later than RenewDeadline after the last successful renewal, whenever the
// lease is lost: in steady state, during ShutdownDelay, during the drain. Each cell runs
// one replica twice, with quiesce and with plain controller-runtime, on a lock whose
// renewals the spec makes fail (as an API server that refuses them).
const (
	fenceLeaseDuration = 3 * time.Second
	fenceRenewDeadline = 2 * time.Second
	fenceRetryPeriod   = 200 * time.Millisecond
	fenceGrace         = 6 * time.Second // CancelAfter 4.8s: beyond the renew deadline
	fenceDelay         = 3 * time.Second
	// fenceBreakAfter: how long after the stop began the renewals start to fail.
	fenceBreakAfter = 200 * time.Millisecond
)

// breakableLock is a resourcelock.Interface whose writes fail once broken, and which
// records when the last successful renewal was sent.
type breakableLock struct {
	resourcelock.Interface
	mu          sync.Mutex
	broken      bool
	lastRenewal time.Time
}

func (b *breakableLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return b.write(ctx, ler, b.Interface.Update)
}

func (b *breakableLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return b.write(ctx, ler, b.Interface.Create)
}

func (b *breakableLock) write(ctx context.Context, ler resourcelock.LeaderElectionRecord,
	fn func(context.Context, resourcelock.LeaderElectionRecord) error,
) error {
	b.mu.Lock()
	broken := b.broken
	b.mu.Unlock()
	if broken {
		return errors.New("renewals refused by the spec")
	}
	sent := time.Now()
	if err := fn(ctx, ler); err != nil {
		return err
	}
	if ler.HolderIdentity == b.Identity() {
		b.mu.Lock()
		b.lastRenewal = sent
		b.mu.Unlock()
	}
	return nil
}

func (b *breakableLock) breakRenewals() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.broken = true
}

func (b *breakableLock) last() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastRenewal
}

// fenceCell is one moment at which the lease is lost.
type fenceCell struct {
	name  string
	delay time.Duration // ShutdownDelay; the stop begins before the renewals fail
	stop  bool          // a stop (SIGTERM) begins fenceBreakAfter before the renewals fail
}

// fenceRun is what one run of a cell saw.
type fenceRun struct {
	cutAfterRenewal time.Duration // from the last successful renewal to the work's context end
	cause           error
	startErr        error
	leaseLine       string // quiesce's "Leadership lost" line
}

func runFenceCell(ctx context.Context, c fenceCell, withQuiesce bool) fenceRun {
	GinkgoHelper()
	ns := newNamespace(ctx)
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	inner, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, "quiesce-fence", cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: "replica-" + ns})
	Expect(err).NotTo(HaveOccurred())
	lock := &breakableLock{Interface: inner}

	logs := &logLines{}
	logsOpt := runnable.Options{Logger: logs.logger(), GracePeriod: fenceGrace, ShutdownDelay: c.delay}
	leaderElection := func(o *manager.Options) {
		o.LeaderElection = true
		o.LeaderElectionResourceLockInterface = lock // Setup (newQuiesced) wraps it
		o.LeaderElectionReleaseOnCancel = true
		o.LeaseDuration = ptr.To(fenceLeaseDuration)
		o.RenewDeadline = ptr.To(fenceRenewDeadline)
		o.RetryPeriod = ptr.To(fenceRetryPeriod)
		o.GracefulShutdownTimeout = ptr.To(fenceGrace + 4*time.Second)
	}
	var mgr manager.Manager
	var q *runnable.Runnable
	if withQuiesce {
		var err error
		mgr, q, err = newQuiesced(logsOpt, inNamespace(ns), leaderElection)
		Expect(err).NotTo(HaveOccurred())
	} else {
		mgr = newPlainManager(inNamespace(ns), leaderElection)
	}
	type outcome struct {
		at    time.Time
		cause error
	}
	outcomes := make(chan outcome, 1)
	started := make(chan struct{}, 1)
	release, releaseAll := releaser()
	var rec reconcile.Reconciler = reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		if req.Name != "work" {
			return reconcile.Result{}, nil
		}
		select {
		case started <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			outcomes <- outcome{at: time.Now(), cause: context.Cause(ctx)}
			return reconcile.Result{}, ctx.Err()
		case <-release:
			return reconcile.Result{}, nil
		}
	})
	if withQuiesce {
		rec = reconcilers.Wrap(q.Executor(), "fence", rec, reconcilers.WrapOptions{})
	}
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("fence").Complete(rec)).To(Succeed())

	var stop context.CancelFunc
	var done <-chan error
	if q != nil && c.delay > 0 {
		stop, done = startManager(mgr, q)
	} else {
		stop, done = startManager(mgr)
	}
	Eventually(mgr.Elected(), 15*time.Second).Should(BeClosed())
	configMap(ctx, ns, "work")
	Eventually(started, 10*time.Second).Should(Receive(), "the reconcile is in flight")

	if c.stop {
		stop()
		time.Sleep(fenceBreakAfter) // the renewals fail this long after the stop began
	}
	lock.breakRenewals()
	var run fenceRun
	var o outcome
	select {
	case o = <-outcomes:
	case <-time.After(fenceGrace + 5*time.Second):
	}
	releaseAll()
	run.cutAfterRenewal, run.cause = o.at.Sub(lock.last()), o.cause
	if o.at.IsZero() {
		run.cutAfterRenewal = -1 // never cut
	}
	Eventually(done, 20*time.Second).Should(Receive(&run.startErr))
	if q != nil {
		Eventually(q.Done(), 10*time.Second).Should(BeClosed())
		for _, l := range logs.all() {
			if strings.Contains(l, `"msg"="Leadership lost: cancelling calls"`) {
				run.leaseLine = l
			}
		}
	}
	return run
}

var _ = Describe("Fencing on a lost lease", func() {
	for _, c := range []fenceCell{
		{name: "in steady state, a shielded reconcile in flight"},
		{name: "during the ShutdownDelay", delay: fenceDelay, stop: true},
		{name: "during the drain", stop: true},
	} {
		It("should end every context quiesce keeps alive within RenewDeadline of the last renewal: "+c.name, func(ctx SpecContext) {
			cur := goleak.IgnoreCurrent()
			plain := runFenceCell(ctx, c, false)
			quiesced := runFenceCell(ctx, c, true)
			_, _ = fmt.Fprintf(GinkgoWriter, "fencing | %s | quiesce: cut %v after the last renewal (%v), mgr.Start %v | plain: cut %v, mgr.Start %v\n",
				c.name, quiesced.cutAfterRenewal, quiesced.cause, quiesced.startErr, plain.cutAfterRenewal, plain.startErr)

			Expect(quiesced.cutAfterRenewal).To(BeNumerically(">=", 0), "the work's context ended")
			Expect(quiesced.cause).To(MatchError("leader election lost"))
			// The fence fires RenewDeadline after the renewal was sent; the rest is the
			// reconcile's reaction to its context.
			Expect(quiesced.cutAfterRenewal).To(BeNumerically("<", fenceRenewDeadline+500*time.Millisecond))
			Expect(quiesced.leaseLine).To(ContainSubstring(`"lastRenewal"=`))
			Expect(quiesced.leaseLine).To(ContainSubstring(`"reason"="no renewal within the renew deadline"`))
			if c.delay > 0 || !c.stop {
				// The manager still runs: controller-runtime gives the lease up too (quiesce
				// writes it no more) and stops on it.
				Expect(quiesced.startErr).To(MatchError(ContainSubstring("leader election lost")))
			}
			if !c.stop {
				// In steady state plain controller-runtime cuts the work when its elector
				// gives up: quiesce is no later.
				Expect(plain.startErr).To(MatchError(ContainSubstring("leader election lost")))
				Expect(quiesced.cutAfterRenewal).To(BeNumerically("<=", plain.cutAfterRenewal+250*time.Millisecond))
			}
			expectNoLeaks(cur)
		})
	}

	It("should never log a lost lease for a planned stop, nor without leader election", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		logs := &logLines{}
		timeout := func(o *manager.Options) { o.GracefulShutdownTimeout = ptr.To(3 * time.Second) }
		// GracefulShutdownTimeout below GracePeriod is refused at Setup, naming the fix.
		_, _, err := newQuiesced(runnable.Options{Logger: logs.logger(), GracePeriod: 4 * time.Second}, inNamespace(ns), timeout)
		Expect(err).To(MatchError(ContainSubstring("raise the manager's GracefulShutdownTimeout above 4s")))
		mgr, q, err := newQuiesced(runnable.Options{Logger: logs.logger(), GracePeriod: 2 * time.Second}, inNamespace(ns), timeout)
		Expect(err).NotTo(HaveOccurred())
		release, releaseAll := releaser()
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("planned").Complete(
			reconcilers.Wrap(q.Executor(), "planned", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
				<-release // ignores its context: abandoned at the end of the grace period
				return reconcile.Result{}, nil
			}), reconcilers.WrapOptions{}))).To(Succeed())
		stop, done := startManager(mgr)
		configMap(ctx, ns, "work")
		Eventually(q.Executor().Pending, 10*time.Second).Should(HaveLen(1))
		stop()
		Eventually(q.Done(), 10*time.Second).Should(BeClosed())
		Expect(q.Err()).To(HaveOccurred(), "the call was abandoned")
		Eventually(done, 10*time.Second).Should(Receive())
		releaseAll()
		Expect(logs.messages()).NotTo(ContainElement("Leadership lost: cancelling calls"))
		expectNoLeaks(cur)
	})
})
