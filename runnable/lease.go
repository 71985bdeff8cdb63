package runnable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
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

// observeLease returns the lock Setup installs with leader election on: the one mo holds, or
// the one controller-runtime would build (from mo, on a copy of LeaderElectionConfig or else
// of cfg), wrapped so that quiesce sees each read and write of the lease.
func observeLease(cfg *rest.Config, mo *manager.Options) (*leaseObserver, error) {
	l := &leaseObserver{inner: mo.LeaderElectionResourceLockInterface,
		renewDeadline: ptr.Deref(mo.RenewDeadline, defaultRenewDeadline),
		retryPeriod:   ptr.Deref(mo.RetryPeriod, defaultRetryPeriod),
		leaseDuration: ptr.Deref(mo.LeaseDuration, defaultLeaseDuration)}
	if !internal.IsNil(l.inner) {
		if cfg != nil {
			l.cfg = rest.CopyConfig(cfg)
		}
		return l, nil
	}
	lcfg := cfg
	if mo.LeaderElectionConfig != nil { // the lease, and its Events, in another cluster
		lcfg, l.events.cluster = mo.LeaderElectionConfig, rest.CopyConfig(mo.LeaderElectionConfig)
	}
	if lcfg == nil {
		return nil, errors.New("failed to observe the lease: nil rest.Config (pass the one given to ctrl.NewManager)")
	}
	// A copy, as controller-runtime passes one: NewResourceLock sets a Timeout on it.
	inner, err := leaderelection.NewResourceLock(rest.CopyConfig(lcfg), &l.events, leaderelection.Options{
		LeaderElection: true, LeaderElectionResourceLock: mo.LeaderElectionResourceLock,
		LeaderElectionID: mo.LeaderElectionID, LeaderElectionNamespace: mo.LeaderElectionNamespace,
		RenewDeadline: l.renewDeadline, LeaderLabels: mo.LeaderElectionLabels,
	})
	switch {
	case err != nil && mo.LeaderElectionNamespace == "": // outside a cluster (make run)
		return nil, fmt.Errorf("failed to observe the lease: %w (set LeaderElectionNamespace in the "+
			"manager's Options, e.g. os.Getenv(\"POD_NAMESPACE\"), or run without --leader-elect)", err)
	case err != nil:
		return nil, fmt.Errorf("failed to observe the lease: %w", err)
	}
	l.inner, l.cfg = inner, rest.CopyConfig(lcfg)
	return l, nil
}

var (
	errNotCampaigning = errors.New("quiesce: this replica is stopping: it does not acquire the lease")
	errLeaseLost      = errors.New("quiesce: the lease was lost: this replica no longer writes it")
)

// leaseObserver passes every call to inner and watches the outcome: it fences when the lease
// is lost (see fenceAfter), never writes the lease once it did, and refuses to acquire the
// lease once the stop began.
type leaseObserver struct {
	inner         resourcelock.Interface
	renewDeadline time.Duration
	retryPeriod   time.Duration // 0 in tests: the fence is at RenewDeadline
	leaseDuration time.Duration // 0 in tests: no cap
	events        lockEvents
	r             *Runnable    // set by Setup, before the lock is shared
	cfg           *rest.Config // of the lease's cluster, for the claims; nil if unknown

	wmu sync.Mutex // one write at a time: the elector's, or handOver's

	mu          sync.Mutex
	held        bool                              // the last write of ours that succeeded made us the holder
	lost        bool                              // fenced: no write from now on
	lastRenewal time.Time                         // when the last successful renewal was sent, on the Runnable's clock
	last        resourcelock.LeaderElectionRecord // the last record of ours written
	handedOver  bool                              // handOver released the lease: the elector's writes are swallowed
}

// Get reads the lease; another holder while this replica held it means the lease is lost.
// Once handed over, it answers the record this replica wrote last, reading nothing.
func (l *leaseObserver) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	handedOver, last := l.handedOver, l.last
	l.mu.Unlock()
	if handedOver {
		raw, err := json.Marshal(last)
		return &last, raw, err
	}
	rec, raw, err := l.inner.Get(ctx)
	if err == nil && rec != nil && rec.HolderIdentity != "" && rec.HolderIdentity != l.inner.Identity() {
		l.lose(time.Time{})
	}
	return rec, raw, err
}

func (l *leaseObserver) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, ler, l.inner.Create)
}

func (l *leaseObserver) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, ler, l.inner.Update)
}

// write is a renewal, an acquisition or a release; each renewal of ours arms the fence anew.
// Once handed over, it writes nothing and answers success: the elector keeps leading, so it
// never gives up (controller-runtime's OnStoppedLeading) nor releases the successor's lease.
func (l *leaseObserver) write(ctx context.Context, ler resourcelock.LeaderElectionRecord,
	fn func(context.Context, resourcelock.LeaderElectionRecord) error,
) error {
	mine := ler.HolderIdentity == l.inner.Identity()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	lost, campaigning := l.lost || l.r.fenced.Load(), l.r.stop.began() && !l.held
	handedOver := l.handedOver
	l.mu.Unlock()
	switch {
	case handedOver:
		return nil
	case mine && lost:
		return errLeaseLost
	case mine && campaigning:
		return errNotCampaigning
	}
	sent := l.r.clock.Now() // the holder's renewal counts from no earlier than this
	if err := fn(ctx, ler); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if mine {
		l.last = ler
	}
	switch {
	case !mine: // released (LeaderElectionReleaseOnCancel): a planned end, no fence
		l.held = false
	case l.lost || l.r.fenced.Load(): // sent before the fence: the elector gives up at its next renewal
	case sent.After(l.lastRenewal):
		l.held, l.lastRenewal = true, sent
		// Only a goroutine: a fake clock runs the callback under its lock, where the fence's
		// log line, which reads the clock, would deadlock its Step.
		l.r.clock.AfterFunc(l.fenceAfter()-l.r.clock.Since(sent), func() { go l.lose(sent) })
	default:
		l.held = true
	}
	return nil
}

var errNotHeld = errors.New("this replica does not hold the lease")

// handOver releases the lease as client-go's elector releases it (no holder, a duration of
// 1s), with the lock's optimistic concurrency, and from then on swallows every write of this
// replica's elector (see write) and answers its reads (see Get). The fence is disarmed: the
// claims fence the work from now on. It fails, writing nothing, unless this replica holds
// the lease unfenced.
func (l *leaseObserver) handOver(ctx context.Context) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	held, last := l.held && !l.lost && !l.r.fenced.Load(), l.last
	l.mu.Unlock()
	if !held {
		return errNotHeld
	}
	now := metav1.NewTime(l.r.clock.Now())
	if err := l.inner.Update(ctx, resourcelock.LeaderElectionRecord{
		LeaderTransitions: last.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now,
	}); err != nil {
		return fmt.Errorf("failed to release the lease: %w", err)
	}
	l.mu.Lock()
	l.held, l.handedOver = false, true
	l.mu.Unlock()
	return nil
}

// fenceAfter is how long after a renewal was sent the lease counts as lost with none since:
// when client-go's elector gives it up (it waits RetryPeriod, then retries for RenewDeadline:
// LeaderElector.renew), so that quiesce refuses no renewal the elector would still make, and
// never later than LeaseDuration, from when another replica may acquire it.
func (l *leaseObserver) fenceAfter() time.Duration {
	d := l.retryPeriod + l.renewDeadline
	if l.leaseDuration > 0 {
		d = min(d, l.leaseDuration)
	}
	return d
}

// lose marks the lease lost, once, and has the Runnable fence: another identity holds it
// (sent zero), or the fence armed by the renewal sent at sent fired with none since.
func (l *leaseObserver) lose(sent time.Time) {
	expired := !sent.IsZero()
	l.mu.Lock()
	if !l.held || l.lost || expired && !sent.Equal(l.lastRenewal) {
		l.mu.Unlock()
		return
	}
	l.held, l.lost = false, true
	last := l.lastRenewal
	l.mu.Unlock()
	reason := "another replica holds the lease"
	if expired {
		reason = "no renewal within the renew deadline"
	}
	l.r.fence(reason, "lastRenewal", last.UTC().Format(time.RFC3339Nano),
		"sinceLastRenewal", l.r.clock.Since(last).Round(time.Millisecond).String(),
		"fenceAfter", l.fenceAfter().String())
}

// used reports whether a write of this replica's ever succeeded through l (the manager's
// elector uses it): each first one is a renewal.
func (l *leaseObserver) used() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.lastRenewal.IsZero()
}

func (l *leaseObserver) RecordEvent(s string) { l.inner.RecordEvent(s) }
func (l *leaseObserver) Identity() string     { return l.inner.Identity() }
func (l *leaseObserver) Describe() string     { return l.inner.Describe() }

// lockEvents is the recorder.Provider given to leaderelection.NewResourceLock. Its recorder
// drops the lock's Events ("became leader") until Add points it where controller-runtime
// records them: the manager's recorder, or with LeaderElectionConfig a broadcaster to the
// lease's cluster, never stopped, like controller-runtime's for that cluster. Embedding the
// interface keeps it a recorder.Provider across controller-runtime releases.
type lockEvents struct {
	recorder.Provider
	rec     struct{ record.EventRecorder } // read by the elector, once the manager started
	name    string                         // the name the lock asked for: the Events' source
	cluster *rest.Config                   // LeaderElectionConfig, or nil
	caster  record.EventBroadcaster
}

func (p *lockEvents) GetEventRecorderFor(name string) record.EventRecorder {
	p.name, p.rec.EventRecorder = name, &record.FakeRecorder{} // before the lock is shared
	return &p.rec
}

// connect points the lock's Events where controller-runtime records them, before mgr.Start.
func (p *lockEvents) connect(mgr manager.Manager) {
	if p.cluster == nil {
		p.rec.EventRecorder = mgr.GetEventRecorderFor(p.name)
		return
	}
	if cs, err := kubernetes.NewForConfig(p.cluster); err == nil { // NewResourceLock made one already
		p.caster = record.NewBroadcaster()
		p.caster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
		p.rec.EventRecorder = p.caster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: p.name})
	}
}

// electionOff is the lock Setup installs with leader election off, which controller-runtime
// reads only with leader election on: a use of it means leader election was turned on after
// Setup saw it off, and nothing would fence. It refuses every call, so that the replica never
// leads, and makes Start, and so mgr.Start, return errElectionAfterSetup.
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
