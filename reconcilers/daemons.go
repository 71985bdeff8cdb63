package reconcilers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// Defaults of DaemonsOptions (the retry delays of lifecycle.HandlersOptions too).
const (
	DefaultBackoff           = time.Second     // before the first retry, less the jitter
	DefaultMaxBackoff        = 5 * time.Minute // between retries
	DefaultDaemonStopTimeout = 5 * time.Second
)

// DaemonsOptions configure NewDaemons. Zero fields mean the documented defaults.
type DaemonsOptions struct {
	// Backoff is the delay before the first restart of a failed daemon (an error or a
	// panic); each further failure doubles it up to MaxBackoff, less a jitter of up to 10%.
	// An attempt that ran MaxBackoff or longer starts again from Backoff. 0 or negative:
	// DefaultBackoff; at most 100 years.
	Backoff time.Duration

	// MaxBackoff caps the delay. 0 or negative: DefaultMaxBackoff; at least Backoff.
	MaxBackoff time.Duration

	// StopTimeout is how long Stop waits for a signalled daemon. 0:
	// DefaultDaemonStopTimeout; negative: Stop only signals.
	StopTimeout time.Duration

	// Logger receives restarts and stops that timed out, with controller, namespace, name
	// and daemon; fn finds it in its context. Zero (or logr.Discard()): log.Log; to
	// discard, logr.New(log.NullLogSink{}).
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
	o.StopTimeout = cmp.Or(o.StopTimeout, DefaultDaemonStopTimeout)
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

// daemonRestarts registers quiesce_daemon_restarts_total in metrics.Registry at the first
// NewDaemons, or uses the counter of that name registered already.
var daemonRestarts = sync.OnceValue(registerDaemonRestarts)

func registerDaemonRestarts() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quiesce_daemon_restarts_total",
		Help: "Daemons restarted after they returned an error or panicked, by controller.",
	}, []string{"controller"})
	var are prometheus.AlreadyRegisteredError
	if errors.As(metrics.Registry.Register(c), &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing
		}
	}
	return c
}

// Daemons runs kopf's daemons: long-lived functions, one per object and daemon name, while
// the object exists. A reconciler calls Ensure while its object exists and Stop once it is
// deleted; the drain stops them and waits. Each is a tracked call
// "<controller>/<namespace>/<name>/<daemon>" with Pending.Daemon set, never slow.
type Daemons struct {
	ex         *drain.Executor
	controller string
	opts       DaemonsOptions
	restarts   prometheus.Counter

	mu       sync.Mutex
	daemons  map[daemonKey]*daemon // running, or stopping
	finished map[daemonKey]mark    // returned nil: not started again for the same object
	running  int

	restarted atomic.Uint64
}

type daemonKey struct {
	namespace, name, daemon string
}

// daemon is one start of a daemon.
type daemon struct {
	mark
	cancel context.CancelFunc
	done   chan struct{} // closed when its goroutine returned (after its predecessor's)

	stopping bool // its context was ended by Stop or a recreated object; guarded by Daemons.mu
}

// mark is the object a daemon started for; all that is left of one whose fn returned nil.
type mark struct {
	uid        types.UID
	generation int64
}

// NewDaemons returns the Daemons of controller (the name given to Wrap) on ex. It panics on
// a nil or foreign ex or an empty controller.
func NewDaemons(ex *drain.Executor, controller string, opts DaemonsOptions) *Daemons {
	if ex == nil {
		panic("reconcilers.NewDaemons: nil executor")
	}
	internal.Of(ex) // panics for an Executor drain.New did not create
	if controller == "" {
		panic("reconcilers.NewDaemons: empty controller name")
	}
	opts.setDefaults()
	return &Daemons{ex: ex, controller: controller, opts: opts,
		restarts: daemonRestarts().WithLabelValues(controller),
		daemons:  map[daemonKey]*daemon{}, finished: map[daemonKey]mark{}}
}

// Ensure makes sure the daemon name runs fn for obj (as read from the API server: it needs
// its UID), and returns at once: call it on every reconcile. fn should loop until its
// context ends: at Stop, when the drain begins, when the object is recreated (the new
// daemon starts once the old one returned). That context outlives the reconcile and
// carries a logger with controller, namespace, name and daemon.
//
// fn failing (an error or a panic) while its context lives runs again after a backoff,
// logged ("Daemon failed, restarting after a backoff") and counted (Stats,
// quiesce_daemon_restarts_total). fn returning nil is done: not started again for the same
// UID until metadata.generation grows or Stop is called. A changed object does not restart
// a running daemon: read it inside fn.
//
// If ctx ended, Ensure returns its error; once the executor drains, an error wrapping
// drain.ErrDraining (requeued quietly by Wrap); an empty name, a nil fn or obj or one
// without UID, drain.ErrInvalidCall.
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
	if internal.Closed(d.ex.Draining()) {
		return fmt.Errorf("failed to ensure daemon %q: %w", internal.Cut(name), drain.ErrDraining)
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
	if old != nil { // an old daemon (a deleted object's, or stopped) returns before the new one runs
		old.stopping = true
		old.cancel()
	}
	logger := d.opts.Logger.WithValues(
		"controller", d.controller, "namespace", k.namespace, "name", k.name, "daemon", name)
	dctx, cancel := context.WithCancel(log.IntoContext(context.Background(), logger))
	dm := &daemon{mark: mark{uid: uid, generation: gen}, cancel: cancel, done: make(chan struct{})}
	d.daemons[k] = dm
	d.running++
	d.mu.Unlock()

	o := internal.CallOptions{Name: d.controller, Namespace: k.namespace, Object: k.name + "/" + name,
		Controller: d.controller, Daemon: true}
	err := internal.Of(d.ex).Go(dctx, o, func(ctx context.Context) error {
		d.run(ctx, logger, k, dm, old, fn)
		return nil
	})
	if err != nil { // refused: the drain began meanwhile
		d.mu.Lock()
		if old != nil && d.daemons[k] == dm {
			d.daemons[k] = old // still stopping: Stop waits for it
		}
		d.mu.Unlock()
		d.exited(k, dm, false)
		return fmt.Errorf("failed to start daemon %q: %w", internal.Cut(o.FullName()), err)
	}
	return nil
}

// run waits for dm's predecessor, then runs fn, restarting it after a backoff while it
// fails and its context lives.
func (d *Daemons) run(ctx context.Context, logger logr.Logger, k daemonKey, dm *daemon, prev *daemon,
	fn func(context.Context) error) {
	finished := false
	defer func() { d.exited(k, dm, finished) }()
	if prev != nil {
		// Waited for even if this one stops meanwhile: whoever waits for this one waits for both.
		<-prev.done
	}
	initial := wait.Backoff{Duration: d.opts.Backoff, Factor: 2, Steps: 64, Cap: d.opts.MaxBackoff}
	b := initial
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
			b = initial // it ran well for a while: start the backoff afresh
		}
		delay := internal.Jitter(b.Step(), rand.Float64())
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

// attempt runs fn once; a panic becomes a *drain.PanicError, and the daemon restarts.
func (d *Daemons) attempt(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			_, name, _ := drain.FromContext(ctx)
			err = &drain.PanicError{Name: name, Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}

// exited forgets dm once its goroutine returns (or never started), leaving it in finished
// if fn returned nil.
func (d *Daemons) exited(k daemonKey, dm *daemon, finished bool) {
	d.mu.Lock()
	if d.daemons[k] == dm {
		delete(d.daemons, k)
		if finished && !dm.stopping {
			d.finished[k] = dm.mark
		}
	}
	d.running--
	d.mu.Unlock()
	dm.cancel() // release the context
	close(dm.done)
}

// Stop signals the daemon name of the object key and waits up to StopTimeout for it. It
// reports whether it stopped: true once fn returned or when none runs; false if it still
// runs, signalled and tracked (call Stop again before releasing the finalizer). It returns
// ctx.Err() if ctx ends first, drain.ErrInvalidCall for an empty name. It works during a
// drain too, and takes a key so that a reconciler that got NotFound can call it.
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

	if d.opts.StopTimeout >= 0 {
		t := d.opts.Clock.NewTimer(d.opts.StopTimeout)
		defer t.Stop()
		select {
		case <-dm.done:
		case <-ctx.Done():
		case <-t.C():
			d.opts.Logger.Info("Daemon did not stop within the stop timeout",
				"controller", d.controller, "namespace", k.namespace, "name", k.name, "daemon", name,
				"stopTimeout", d.opts.StopTimeout.String())
		}
	}
	if internal.Closed(dm.done) {
		return true, nil
	}
	return false, ctx.Err()
}

// Stats returns the counters of d.
func (d *Daemons) Stats() DaemonsStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return DaemonsStats{Running: d.running, Restarts: d.restarted.Load()}
}
