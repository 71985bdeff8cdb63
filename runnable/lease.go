package runnable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/quiesce-dev/quiesce/internal"
)

// controller-runtime's defaults of RenewDeadline, RetryPeriod and LeaseDuration.
const (
	defaultRenewDeadline = 10 * time.Second
	defaultRetryPeriod   = 2 * time.Second
	defaultLeaseDuration = 15 * time.Second
)

// ObserveLease lets quiesce observe this replica's lease, so that the contexts it keeps
// alive end with the replica's leadership. Call it on the manager's Options once they are
// complete, before ctrl.NewManager; Add (Options.ManagerOptions: the same Options)
// connects it. With opts.LeaderElection off it does nothing; with it on, Add fails
// unless ObserveLease was called.
//
// It sets opts.LeaderElectionResourceLockInterface to the lock that controller-runtime
// would use (leaderelection.NewResourceLock, from opts' LeaderElectionID,
// LeaderElectionNamespace, LeaderElectionResourceLock, RenewDeadline and
// LeaderElectionLabels, on a copy of opts.LeaderElectionConfig or else of cfg: neither is
// changed), or to the lock opts hold
// already, wrapped: every read and write of the lease goes through unchanged, and quiesce
// sees each renewal. Then:
//
//   - fencing: the context of every tracked call ends, with the cause "leader election
//     lost", RetryPeriod + RenewDeadline after the last renewal that succeeded unless
//     another one succeeded meanwhile (client-go's elector waits RetryPeriod after a
//     renewal, then retries for RenewDeadline before it gives the lease up: quiesce refuses
//     no renewal it would still make), never later than LeaseDuration after it (when
//     another replica may acquire the lease), or as soon
//     as a read of the lease shows another holder; one line, "Leadership lost: cancelling
//     calls", says when the last renewal succeeded. From then on the replica never writes
//     the lease again, so its elector gives up too and the manager stops, as
//     controller-runtime stops on a lost lease. This holds in steady state, during
//     ShutdownDelay and during the drain;
//   - no campaigning once the stop began: from the start of the stop (SIGTERM, the start
//     of ShutdownDelay) a replica that does not hold the lease never acquires it (its
//     elector logs the refused write); the leader renews it until its drain is over, and
//     releases it then if LeaderElectionReleaseOnCancel is set.
//
// With opts.LeaderElectionConfig set (the lease in another cluster), the elector's
// Events ("became leader") are not recorded. ObserveLease is idempotent.
func ObserveLease(cfg *rest.Config, opts *manager.Options) error {
	if opts == nil {
		return errors.New("failed to observe the lease: nil manager Options")
	}
	if !opts.LeaderElection {
		return nil
	}
	if _, ok := opts.LeaderElectionResourceLockInterface.(*leaseObserver); ok {
		return nil
	}
	deadline := defaultRenewDeadline
	if opts.RenewDeadline != nil {
		deadline = *opts.RenewDeadline
	}
	l := &leaseObserver{inner: opts.LeaderElectionResourceLockInterface, renewDeadline: deadline,
		retryPeriod:   orDefault(opts.RetryPeriod, defaultRetryPeriod),
		leaseDuration: orDefault(opts.LeaseDuration, defaultLeaseDuration)}
	if internal.IsNil(l.inner) { // unset, or a typed nil: controller-runtime's own lock
		l.inner = nil
		lcfg := cfg
		if opts.LeaderElectionConfig != nil {
			lcfg = opts.LeaderElectionConfig
		}
		if lcfg == nil {
			return errors.New("failed to observe the lease: nil rest.Config (pass the one given to ctrl.NewManager)")
		}
		events := &l.events
		if opts.LeaderElectionConfig != nil {
			events = &lockEvents{} // never connected: its Events are dropped
		}
		// A copy, as controller-runtime passes one: NewResourceLock sets the user agent and a
		// Timeout of RenewDeadline/2 on the config it is given.
		inner, err := leaderelection.NewResourceLock(rest.CopyConfig(lcfg), events, leaderelection.Options{
			LeaderElection:             true,
			LeaderElectionResourceLock: opts.LeaderElectionResourceLock,
			LeaderElectionID:           opts.LeaderElectionID,
			LeaderElectionNamespace:    opts.LeaderElectionNamespace,
			RenewDeadline:              deadline,
			LeaderLabels:               opts.LeaderElectionLabels,
		})
		if err != nil {
			if opts.LeaderElectionNamespace == "" {
				// controller-runtime's lock needs a namespace outside a cluster (make run).
				return fmt.Errorf("failed to observe the lease: %w (set LeaderElectionNamespace in the "+
					"manager's Options, e.g. os.Getenv(\"POD_NAMESPACE\"), or run without --leader-elect)", err)
			}
			return fmt.Errorf("failed to observe the lease: %w", err)
		}
		l.inner = inner
	}
	opts.LeaderElectionResourceLockInterface = l
	return nil
}

// errNotCampaigning is the error of a write that would acquire the lease once the stop began.
var errNotCampaigning = errors.New("quiesce: this replica is stopping: it does not acquire the lease")

// errLeaseLost is the error of every write of the lease once quiesce fenced.
var errLeaseLost = errors.New("quiesce: the lease was lost: this replica no longer writes it")

// leaseObserver is the resourcelock.Interface that ObserveLease installs: it passes every
// call to inner and watches the outcome.
type leaseObserver struct {
	inner         resourcelock.Interface
	renewDeadline time.Duration
	retryPeriod   time.Duration // 0 in tests: the fence is at RenewDeadline
	leaseDuration time.Duration // 0 in tests: no cap
	events        lockEvents
	r             atomic.Pointer[Runnable] // connected by Add

	mu          sync.Mutex
	held        bool        // the last write of ours that succeeded made us the holder
	acquired    bool        // a write of ours ever succeeded: the manager's elector uses l
	lost        bool        // fenced: no write from now on
	stopping    bool        // the stop began: no acquisition
	lastRenewal time.Time   // when the last successful renewal was sent, on the Runnable's clock
	fence       clock.Timer // fires fenceAfter() after lastRenewal
	fenceGen    uint64      // counts the fences armed: a timer fires for the newest only
}

var _ resourcelock.Interface = (*leaseObserver)(nil)

// connect connects l to r; false if it is connected to another Runnable.
func (l *leaseObserver) connect(r *Runnable) bool { return l.r.CompareAndSwap(nil, r) }

// disconnect undoes connect(r), for an Add that failed.
func (l *leaseObserver) disconnect(r *Runnable) {
	if l != nil {
		l.r.CompareAndSwap(r, nil)
	}
}

func (l *leaseObserver) clock() clock.WithTickerAndDelayedExecution {
	if r := l.r.Load(); r != nil {
		return r.clock
	}
	return clock.RealClock{}
}

// Get reads the lease; a record held by another identity while this replica held it means
// the lease is lost.
func (l *leaseObserver) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := l.inner.Get(ctx)
	if err == nil && rec != nil && rec.HolderIdentity != "" && rec.HolderIdentity != l.inner.Identity() {
		l.lose(false)
	}
	return rec, raw, err
}

// Create creates the lease, as Update does.
func (l *leaseObserver) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, ler, l.inner.Create)
}

// Update writes the lease: a renewal, an acquisition, or a release. Once the stop began a
// write that would acquire the lease is refused, and once fenced every write of ours is.
func (l *leaseObserver) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, ler, l.inner.Update)
}

func (l *leaseObserver) write(ctx context.Context, ler resourcelock.LeaderElectionRecord,
	fn func(context.Context, resourcelock.LeaderElectionRecord) error,
) error {
	mine := ler.HolderIdentity == l.inner.Identity()
	l.mu.Lock()
	switch {
	case mine && l.lost:
		l.mu.Unlock()
		return errLeaseLost
	case mine && l.stopping && !l.held:
		l.mu.Unlock()
		return errNotCampaigning
	}
	l.mu.Unlock()
	// Stamped before the write: the holder's renewal counts from no earlier than this.
	sent := l.clock().Now()
	if err := fn(ctx, ler); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !mine { // released (LeaderElectionReleaseOnCancel): a planned end, no fence
		l.held = false
		l.stopFence()
		return nil
	}
	if l.lost {
		return nil // sent before the fence: the elector gives up at its next renewal
	}
	l.held, l.acquired = true, true
	if sent.After(l.lastRenewal) {
		l.lastRenewal = sent
		l.stopFence()
		l.fenceGen++
		gen := l.fenceGen
		// The callback only starts a goroutine: a fake clock (k8s.io/utils/clock/testing)
		// runs it under its own lock, where a call of the clock (the fence's log line reads
		// it) would deadlock its Step.
		l.fence = l.clock().AfterFunc(l.fenceAfter()-l.clock().Since(sent), func() { go l.expire(gen) })
	}
	return nil
}

// fenceAfter is how long after a successful renewal was sent the lease counts as lost with
// no renewal since: when client-go's elector gives it up, RetryPeriod + RenewDeadline after
// a renewal (it waits RetryPeriod, then retries for RenewDeadline: LeaderElector.renew), so
// that quiesce never refuses a renewal the elector would still make, and never later than
// LeaseDuration, from when another replica may acquire it.
func (l *leaseObserver) fenceAfter() time.Duration {
	d := l.retryPeriod + l.renewDeadline
	if l.leaseDuration > 0 {
		d = min(d, l.leaseDuration)
	}
	return d
}

func orDefault(d *time.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return *d
}

func (l *leaseObserver) stopFence() {
	if l.fence != nil {
		l.fence.Stop()
		l.fence = nil
	}
}

// expire fences when the fence armed as number gen fired and no renewal armed another.
func (l *leaseObserver) expire(gen uint64) {
	l.mu.Lock()
	due := l.held && !l.lost && gen == l.fenceGen
	l.mu.Unlock()
	if due {
		l.lose(true)
	}
}

// lose marks the lease lost, once, and has the Runnable fence. expired: RenewDeadline
// passed since the last renewal; otherwise another identity holds the lease.
func (l *leaseObserver) lose(expired bool) {
	l.mu.Lock()
	if !l.held || l.lost {
		l.mu.Unlock()
		return
	}
	l.held, l.lost = false, true
	l.stopFence()
	last := l.lastRenewal
	l.mu.Unlock()
	if r := l.r.Load(); r != nil {
		reason := "another replica holds the lease"
		if expired {
			reason = "no renewal within the renew deadline"
		}
		r.fence(last, l.fenceAfter(), reason)
	}
}

// stop marks the start of the stop: from now on the replica acquires no lease it does not hold.
func (l *leaseObserver) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping = true
}

// RecordEvent, Identity and Describe are inner's.
func (l *leaseObserver) RecordEvent(s string) { l.inner.RecordEvent(s) }
func (l *leaseObserver) Identity() string     { return l.inner.Identity() }
func (l *leaseObserver) Describe() string     { return l.inner.Describe() }

// lockEvents is the recorder.Provider given to leaderelection.NewResourceLock: the lock's
// Events go to the manager's recorder once Add connected it (mgr.GetEventRecorderFor, as
// controller-runtime itself does), and are dropped before (the elector records none before
// the manager starts). Embedding the interface keeps it a recorder.Provider across
// controller-runtime releases; only GetEventRecorderFor is ever called.
type lockEvents struct {
	recorder.Provider
	to atomic.Pointer[record.EventRecorder]
}

func (p *lockEvents) GetEventRecorderFor(string) record.EventRecorder { return (*lockRecorder)(p) }

// lockRecorder forwards to the recorder Add connected, if any.
type lockRecorder lockEvents

func (r *lockRecorder) get() record.EventRecorder {
	if p := r.to.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *lockRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	if to := r.get(); to != nil {
		to.Event(obj, eventtype, reason, message)
	}
}

func (r *lockRecorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if to := r.get(); to != nil {
		to.Eventf(obj, eventtype, reason, messageFmt, args...)
	}
}

func (r *lockRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string,
	eventtype, reason, messageFmt string, args ...any,
) {
	if to := r.get(); to != nil {
		to.AnnotatedEventf(obj, annotations, eventtype, reason, messageFmt, args...)
	}
}

// used reports whether a write of this replica's ever succeeded through l. Once the manager
// says it leads (Elected closed), false means its elector holds the lease through another
// lock: the manager was made before ObserveLease installed l.
func (l *leaseObserver) used() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acquired
}
