package reconcilers

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// DefaultDaemonStopTimeout is how long Daemons.Stop waits for a daemon to return by default
// (DaemonsOptions.StopTimeout): a daemon's stop, not a process's (shutdowntest's
// DefaultStopTimeout).
const DefaultDaemonStopTimeout = 5 * time.Second

// DaemonsOptions configure NewDaemons. The zero value is valid: every zero field means the
// documented default.
type DaemonsOptions struct {
	// Backoff is the delay before the first restart of a daemon that failed (returned an
	// error or panicked); each further consecutive failure doubles it, up to MaxBackoff. A
	// random jitter then shortens each delay by up to 10%, so that daemons that failed
	// together do not all restart at the same moment. An attempt that ran for MaxBackoff or
	// longer before failing was healthy: the next delay starts again from Backoff.
	// 0 or negative: DefaultBackoff; above 100 years: 100 years.
	Backoff time.Duration

	// MaxBackoff caps the restart delay. 0 or negative: DefaultMaxBackoff; below Backoff:
	// Backoff; above 100 years: 100 years.
	MaxBackoff time.Duration

	// StopTimeout is how long Stop waits for a signalled daemon to return. 0:
	// DefaultDaemonStopTimeout.
	// Negative: Stop only signals, and reports whether the daemon had already returned.
	StopTimeout time.Duration

	// Logger receives the daemons' restarts and the stops that timed out; each line carries
	// the keys controller, namespace, name and daemon. A daemon's fn finds it in its context
	// (log.FromContext). The zero value, as in every quiesce Options but drain's:
	// controller-runtime's logger (log.Log, which ctrl.SetLogger sets). logr.Discard() is
	// the zero value too: to discard, pass logr.New(log.NullLogSink{}).
	Logger logr.Logger

	// Clock times the restart backoffs and StopTimeout. nil: clock.RealClock{}.
	Clock clock.Clock
}

func (o *DaemonsOptions) setDefaults() {
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	o.Backoff = min(o.Backoff, internal.BackoffCeiling)
	o.MaxBackoff = min(max(o.MaxBackoff, o.Backoff), internal.BackoffCeiling)
	if o.StopTimeout == 0 {
		o.StopTimeout = DefaultDaemonStopTimeout
	}
	if internal.NoLogger(o.Logger) {
		o.Logger = log.Log
	}
	if internal.IsNil(o.Clock) {
		o.Clock = clock.RealClock{}
	}
}

// DaemonsStats are the counters of a Daemons.
type DaemonsStats struct {
	Running  int    // daemons whose goroutine has not returned (including those stopping)
	Restarts uint64 // restarts after a daemon failed (returned an error or panicked)
}

// daemonRestarts counts restarts process-wide. registerDaemonRestarts registers it.
var (
	daemonRestarts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quiesce_daemon_restarts_total",
		Help: "Daemons restarted after they returned an error or panicked, by controller.",
	}, []string{"controller"})
	daemonRestartsOnce sync.Once
)

// registerDaemonRestarts registers daemonRestarts in controller-runtime's metrics.Registry,
// once: at the first NewDaemons, so that a process without daemons serves no such metric.
// A counter of that name registered already (another copy of this package) is used instead.
func registerDaemonRestarts() *prometheus.CounterVec {
	daemonRestartsOnce.Do(func() {
		err := metrics.Registry.Register(daemonRestarts)
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				daemonRestarts = existing
			}
		}
	})
	return daemonRestarts
}

// Daemons runs long-lived functions, one per object and daemon name, for as long as the
// object exists: kopf's daemons. A reconciler calls Ensure while its object exists and Stop
// once it is being deleted (or NotFound); failed daemons restart after a backoff, and the
// drain stops them and waits for them.
//
// Each daemon is a tracked call "<controller>/<namespace>/<name>/<daemon>" on a goroutine
// of its own, listed with Pending.Daemon set and never counted as slow: running long is its
// job. The drain ends every daemon's context the moment it begins, and starts or restarts
// none after that. Daemons run where Ensure is called: with leader election, on the leader.
//
// Daemons are keyed by the object's namespace, name and the daemon's name, and carry the
// object's UID: for an object recreated under the same name, the old daemon is signalled and
// the new one starts once it returned.
//
// A daemon costs a goroutine while it runs, and is forgotten once it returned. One that
// returned nil leaves a mark (its object's UID and generation) so that Ensure does not start
// it again; Stop removes it, as kopf forgets a daemon that exited on its own when its object
// is deleted. An Ensure that finds its daemon running allocates nothing.
//
// All methods are safe for concurrent use. Ensure never blocks (daemons take no
// MaxConcurrent slot); Stop blocks up to StopTimeout.
type Daemons struct {
	ex         *drain.Executor
	controller string
	opts       DaemonsOptions
	restarts   prometheus.Counter

	mu       sync.Mutex
	daemons  map[daemonKey]*daemon  // running, or stopping
	finished map[daemonKey]doneMark // returned nil: not started again for the same object
	running  int

	restarted atomic.Uint64
}

type daemonKey struct {
	namespace, name, daemon string
}

// daemon is one start of a daemon: its goroutine, its attempts and restarts.
type daemon struct {
	uid        types.UID
	generation int64
	cancel     context.CancelFunc
	done       chan struct{} // closed when its goroutine returned (after its predecessor's)

	stopping bool // its context was ended by Stop or a recreated object; guarded by Daemons.mu
}

// doneMark is what is left of a daemon whose fn returned nil: the object it ran for.
type doneMark struct {
	uid        types.UID
	generation int64
}

// NewDaemons returns the Daemons of the controller named controller (the name given to
// Wrap), running on ex (in an operator, the Executor of the runnable.Runnable). It panics
// if ex is nil or not created by drain.New, or if controller is empty: programming errors
// found at setup.
func NewDaemons(ex *drain.Executor, controller string, opts DaemonsOptions) *Daemons {
	if ex == nil {
		panic("reconcilers.NewDaemons: nil executor")
	}
	internal.Of(ex) // panics for an Executor drain.New did not create
	if controller == "" {
		panic("reconcilers.NewDaemons: empty controller name")
	}
	opts.setDefaults()
	d := &Daemons{
		ex:         ex,
		controller: controller,
		opts:       opts,
		restarts:   registerDaemonRestarts().WithLabelValues(controller),
		daemons:    map[daemonKey]*daemon{},
		finished:   map[daemonKey]doneMark{},
	}
	return d
}

// Ensure makes sure the daemon named name runs fn for obj, and returns at once. obj must
// be the object as read from the API server (it needs its UID).
//
// If the daemon runs already for this object (same UID), Ensure does nothing: call it on
// every reconcile. If it is not running, Ensure starts fn on a tracked goroutine. fn should
// loop until its context ends, and then return: its context ends when Stop is called for
// the object, when the object was recreated (see Daemons), and when the drain begins.
// fn's context is not the reconcile's (it outlives it): it carries a logger with the keys
// controller, namespace, name and daemon (log.FromContext), and reconcilers.Call inside fn
// runs tracked calls named after the daemon.
//
// When fn returns an error or panics while its context is alive, it runs again after a
// backoff (see DaemonsOptions.Backoff), logged (message "Daemon failed, restarting after a
// backoff", with the stack of a panic) and counted (Stats, and the metric
// quiesce_daemon_restarts_total). When it returns nil, the daemon is done: Ensure does not
// start it again for the same object (same UID) until the object's generation
// (metadata.generation) grows past the one it ran for, or Stop was called.
// A running daemon is not restarted when its object changes: read the object inside fn.
//
// ctx is the reconcile's: if it ended already, Ensure starts nothing and returns its error.
// Once the executor drains, Ensure starts nothing and returns an error for which
// errors.Is(err, drain.ErrDraining) holds: returned from a reconciler given to Wrap, the
// request is requeued quietly. An empty name, a nil fn, a nil obj or one without a UID
// give an error wrapping drain.ErrInvalidCall.
func (d *Daemons) Ensure(ctx context.Context, obj client.Object, name string, fn func(context.Context) error) error {
	switch {
	case name == "":
		return fmt.Errorf("failed to ensure daemon: empty name: %w", drain.ErrInvalidCall)
	case fn == nil:
		return fmt.Errorf("failed to ensure daemon %q: nil func: %w", internal.Cut(name), drain.ErrInvalidCall)
	case internal.IsNil(obj):
		return fmt.Errorf("failed to ensure daemon %q: nil object: %w", internal.Cut(name), drain.ErrInvalidCall)
	case obj.GetUID() == "":
		return fmt.Errorf("failed to ensure daemon %q of %s/%s: the object has no UID "+
			"(pass the object read from the API server): %w", internal.Cut(name), internal.Cut(obj.GetNamespace()),
			internal.Cut(obj.GetName()), drain.ErrInvalidCall)
	}
	select {
	case <-d.ex.Draining():
		return fmt.Errorf("failed to ensure daemon %q: %w", internal.Cut(name), drain.ErrDraining)
	default:
	}
	k := daemonKey{namespace: obj.GetNamespace(), name: obj.GetName(), daemon: name}
	uid, gen := obj.GetUID(), obj.GetGeneration()

	d.mu.Lock()
	old := d.daemons[k]
	if old != nil && old.uid == uid && !old.stopping {
		d.mu.Unlock()
		return nil // the hot path: running
	}
	if m, ok := d.finished[k]; ok && old == nil && m.uid == uid && gen <= m.generation {
		d.mu.Unlock()
		return nil // done for this generation
	}
	if err := ctx.Err(); err != nil {
		d.mu.Unlock()
		return fmt.Errorf("failed to ensure daemon %q: %w", internal.Cut(name), err)
	}
	delete(d.finished, k)
	// The old daemon, if any, belongs to a deleted object or to a stop: the new one waits
	// for it to return first.
	var prev *daemon
	if old != nil {
		old.stopping = true
		old.cancel()
		select {
		case <-old.done:
		default:
			prev = old
		}
	}
	logger := d.opts.Logger.WithValues(
		"controller", d.controller, "namespace", k.namespace, "name", k.name, "daemon", name)
	dctx, cancel := context.WithCancel(log.IntoContext(context.Background(), logger))
	dm := &daemon{uid: uid, generation: gen, cancel: cancel, done: make(chan struct{})}
	d.daemons[k] = dm
	d.running++
	d.mu.Unlock()

	full := joinDaemonName(d.controller, k)
	err := d.start(dctx, full, func(ctx context.Context) error {
		d.run(ctx, logger, k, dm, prev, fn)
		return nil
	})
	if err != nil { // refused: the drain began meanwhile
		cancel()
		d.mu.Lock()
		if d.daemons[k] == dm {
			if prev != nil {
				d.daemons[k] = prev // still stopping: Stop waits for it
			} else {
				delete(d.daemons, k)
			}
		}
		d.running--
		d.mu.Unlock()
		close(dm.done)
		return fmt.Errorf("failed to start daemon %q: %w", internal.Cut(full), err)
	}
	return nil
}

// start starts fn as a tracked call of the executor named name, marked as a daemon, without
// waiting for it: Pending lists it with Daemon set, it is never logged or counted as slow,
// and the drain ends its context the moment it begins.
func (d *Daemons) start(ctx context.Context, name string, fn func(context.Context) error) error {
	return internal.Of(d.ex).Go(ctx, internal.CallOptions{Name: name, Controller: d.controller, Daemon: true}, fn)
}

// joinDaemonName returns "<controller>/<namespace>/<name>/<daemon>", without the namespace
// for cluster-scoped objects.
func joinDaemonName(controller string, k daemonKey) string {
	if k.namespace == "" {
		return controller + "/" + k.name + "/" + k.daemon
	}
	return controller + "/" + k.namespace + "/" + k.name + "/" + k.daemon
}

// run is the body of a daemon's tracked call: it waits for its predecessor, then runs fn,
// restarting it after a backoff while it fails and its context is alive.
func (d *Daemons) run(ctx context.Context, logger logr.Logger, k daemonKey, dm *daemon, prev *daemon,
	fn func(context.Context) error) {
	finished := false
	defer func() { d.exited(k, dm, finished) }()
	if prev != nil {
		// One daemon per object and name at a time: the old object's daemon was signalled
		// and returns first. It is waited for even if this one is stopped meanwhile, so that
		// whoever waits for this one (Stop, the drain) waits for both.
		<-prev.done
	}
	b := d.newBackoff()
	for ctx.Err() == nil {
		began := d.opts.Clock.Now()
		err := d.attempt(ctx, fn)
		if ctx.Err() != nil {
			return // stopped: whatever fn returned, it is not restarted
		}
		if err == nil {
			finished = true
			return
		}
		if d.opts.Clock.Since(began) >= d.opts.MaxBackoff {
			b = d.newBackoff() // it ran well for a while: start the backoff afresh
		}
		delay := b.Step()
		delay = internal.Jitter(delay, jitterRand())
		d.restarted.Add(1)
		d.restarts.Inc()
		kv := []any{"delay", delay.String()}
		var pe *drain.PanicError
		if errors.As(err, &pe) {
			kv = append(kv, "stack", string(pe.Stack))
		}
		logger.Error(err, "Daemon failed, restarting after a backoff", kv...)
		t := d.opts.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// newBackoff returns the backoff of a daemon's restarts, its jitter applied by run.
func (d *Daemons) newBackoff() wait.Backoff {
	// 63 doublings take any delay from 1ns past the ceiling; after that Step returns Cap.
	return wait.Backoff{Duration: d.opts.Backoff, Factor: 2, Steps: 64, Cap: d.opts.MaxBackoff}
}

// attempt runs fn once; a panic becomes a *drain.PanicError, so that the daemon restarts
// instead of ending its tracked call.
func (d *Daemons) attempt(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			_, name, _ := drain.FromContext(ctx)
			err = &drain.PanicError{Name: name, Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}

// exited forgets dm once its goroutine returns, leaving a doneMark if fn returned nil.
func (d *Daemons) exited(k daemonKey, dm *daemon, finished bool) {
	d.mu.Lock()
	if d.daemons[k] == dm {
		delete(d.daemons, k)
		if finished && !dm.stopping {
			d.finished[k] = doneMark{uid: dm.uid, generation: dm.generation}
		}
	}
	d.running--
	d.mu.Unlock()
	dm.cancel() // release the context
	close(dm.done)
}

// Stop signals the daemon named name of the object key (its context ends) and waits up to
// StopTimeout for it to return. It reports whether the daemon is stopped: true when its fn
// returned (the executor unlists its call a moment later), or when none runs (Stop is
// idempotent); false when it still runs after StopTimeout, in which case it stays
// signalled and tracked: call Stop again later (for example after a requeue) before
// releasing the object's finalizer. It returns ctx.Err() if ctx ends first, and an error
// wrapping drain.ErrInvalidCall for an empty name.
//
// Stop works during a drain too. It takes a key, not an object, so that a reconciler that
// got NotFound can call it with the request's NamespacedName.
func (d *Daemons) Stop(ctx context.Context, key client.ObjectKey, name string) (stopped bool, err error) {
	if name == "" {
		return false, fmt.Errorf("failed to stop daemon: empty name: %w", drain.ErrInvalidCall)
	}
	k := daemonKey{namespace: key.Namespace, name: key.Name, daemon: name}
	d.mu.Lock()
	delete(d.finished, k)
	dm := d.daemons[k]
	if dm == nil {
		d.mu.Unlock()
		return true, nil
	}
	dm.stopping = true
	dm.cancel()
	d.mu.Unlock()

	select {
	case <-dm.done:
		return true, nil
	default:
	}
	if d.opts.StopTimeout < 0 {
		return false, nil
	}
	t := d.opts.Clock.NewTimer(d.opts.StopTimeout)
	defer t.Stop()
	select {
	case <-dm.done:
		return true, nil
	case <-t.C():
		d.opts.Logger.Info("Daemon did not stop within the stop timeout",
			"controller", d.controller, "namespace", k.namespace, "name", k.name, "daemon", name,
			"stopTimeout", d.opts.StopTimeout.String())
		return false, nil
	case <-ctx.Done():
		select {
		case <-dm.done:
			return true, nil
		default:
		}
		return false, ctx.Err()
	}
}

// Stats returns the counters of d.
func (d *Daemons) Stats() DaemonsStats {
	d.mu.Lock()
	running := d.running
	d.mu.Unlock()
	return DaemonsStats{Running: running, Restarts: d.restarted.Load()}
}
