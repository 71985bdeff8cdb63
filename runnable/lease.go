package runnable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
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

// observeLease returns the lock that Setup installs with leader election on: the lock
// controller-runtime would build (leaderelection.NewResourceLock from mo's LeaderElection*
// fields and RenewDeadline, on a copy of mo.LeaderElectionConfig or else of cfg: neither is
// changed), or the one mo holds, wrapped. Every read and write of the lease goes through
// unchanged; quiesce sees each renewal, fences when the lease is lost, and refuses to
// acquire the lease once the stop began (see Setup).
func observeLease(cfg *rest.Config, mo *manager.Options) (*leaseObserver, error) {
	l := &leaseObserver{inner: mo.LeaderElectionResourceLockInterface,
		renewDeadline: orDefault(mo.RenewDeadline, defaultRenewDeadline),
		retryPeriod:   orDefault(mo.RetryPeriod, defaultRetryPeriod),
		leaseDuration: orDefault(mo.LeaseDuration, defaultLeaseDuration)}
	if !internal.IsNil(l.inner) {
		return l, nil
	}
	lcfg := cfg
	if mo.LeaderElectionConfig != nil {
		// The lease lives in another cluster: so do its Events, as controller-runtime records them.
		lcfg, l.events.cluster = mo.LeaderElectionConfig, rest.CopyConfig(mo.LeaderElectionConfig)
	}
	if lcfg == nil {
		return nil, errors.New("failed to observe the lease: nil rest.Config (pass the one given to ctrl.NewManager)")
	}
	// A copy, as controller-runtime passes one: NewResourceLock sets the user agent and a
	// Timeout of RenewDeadline/2 on the config it is given.
	inner, err := leaderelection.NewResourceLock(rest.CopyConfig(lcfg), &l.events, leaderelection.Options{
		LeaderElection:             true,
		LeaderElectionResourceLock: mo.LeaderElectionResourceLock,
		LeaderElectionID:           mo.LeaderElectionID,
		LeaderElectionNamespace:    mo.LeaderElectionNamespace,
		RenewDeadline:              l.renewDeadline,
		LeaderLabels:               mo.LeaderElectionLabels,
	})
	switch {
	case err != nil && mo.LeaderElectionNamespace == "": // outside a cluster (make run)
		return nil, fmt.Errorf("failed to observe the lease: %w (set LeaderElectionNamespace in the "+
			"manager's Options, e.g. os.Getenv(\"POD_NAMESPACE\"), or run without --leader-elect)", err)
	case err != nil:
		return nil, fmt.Errorf("failed to observe the lease: %w", err)
	}
	l.inner = inner
	return l, nil
}

// errNotCampaigning is the error of a write that would acquire the lease once the stop began.
var errNotCampaigning = errors.New("quiesce: this replica is stopping: it does not acquire the lease")

// errLeaseLost is the error of every write of the lease once quiesce fenced.
var errLeaseLost = errors.New("quiesce: the lease was lost: this replica no longer writes it")

// leaseObserver is the resourcelock.Interface that Setup installs with leader election on:
// it passes every call to inner and watches the outcome.
type leaseObserver struct {
	inner         resourcelock.Interface
	renewDeadline time.Duration
	retryPeriod   time.Duration // 0 in tests: the fence is at RenewDeadline
	leaseDuration time.Duration // 0 in tests: no cap
	events        lockEvents
	r             atomic.Pointer[Runnable] // set by Setup

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

// lockEvents is the recorder.Provider given to leaderelection.NewResourceLock. The lock's
// Events ("became leader") go where controller-runtime records them: to the manager's
// recorder once Add set it (mgr.GetEventRecorderFor), or, with LeaderElectionConfig, to the
// lease's cluster through a broadcaster made at the first Event and, as controller-runtime's
// own for that cluster, never stopped. Before, they are dropped: the elector records none
// before the manager starts. Embedding the interface keeps it a recorder.Provider across
// controller-runtime releases; only GetEventRecorderFor is called.
type lockEvents struct {
	recorder.Provider
	to      atomic.Pointer[record.EventRecorder]
	cluster *rest.Config // LeaderElectionConfig, or nil
	name    string       // the name the lock asked its recorder for: the Events' source
	once    sync.Once
	caster  record.EventBroadcaster
}

func (p *lockEvents) GetEventRecorderFor(name string) record.EventRecorder {
	p.name = name // called once, by NewResourceLock, before the lock is shared
	return (*lockRecorder)(p)
}

// lockRecorder forwards to the recorder of its lockEvents, if any.
type lockRecorder lockEvents

func (r *lockRecorder) get() record.EventRecorder {
	if r.cluster != nil {
		r.once.Do(func() {
			cs, err := kubernetes.NewForConfig(r.cluster)
			if err != nil {
				return // not for a config that NewResourceLock accepted
			}
			r.caster = record.NewBroadcaster()
			r.caster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
			var rec record.EventRecorder = r.caster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: r.name})
			r.to.Store(&rec)
		})
	}
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
// lock, or none.
func (l *leaseObserver) used() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acquired
}

// electionOff is the lock Setup installs when leader election is off. controller-runtime
// uses LeaderElectionResourceLockInterface only with leader election on, so a use of it
// means that leader election was turned on, in the Options given to ctrl.NewManager,
// after Setup saw it off: nothing would fence this replica's calls. It refuses every call,
// so that the replica never leads, and makes the Runnable's Start (and so mgr.Start) return
// errElectionAfterSetup.
type electionOff struct {
	r    *Runnable
	once sync.Once
}

var errElectionAfterSetup = errors.New("failed to start quiesce runnable: leader election was turned on " +
	"after runnable.Setup saw it off, so a lost lease would fence nothing: call " +
	"runnable.Setup(cfg, &mgrOpts, opts) once mgrOpts.LeaderElection is set, and give ctrl.NewManager that same mgrOpts")

func (l *electionOff) refuse() error {
	l.once.Do(func() { l.r.misuse <- errElectionAfterSetup })
	return errElectionAfterSetup
}

func (l *electionOff) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return nil, nil, l.refuse()
}
func (l *electionOff) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	return l.refuse()
}
func (l *electionOff) Update(context.Context, resourcelock.LeaderElectionRecord) error {
	return l.refuse()
}
func (l *electionOff) RecordEvent(string) {}
func (l *electionOff) Identity() string   { return "quiesce-leader-election-off" }
func (l *electionOff) Describe() string   { return "quiesce: leader election off at runnable.Setup" }
