package runnable

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// Options configure a Runnable. The zero value is valid: every zero field means the
// documented default.
type Options struct {
	// Options configure the executor the Runnable owns (see drain.Options for their
	// defaults, which hold here too: SlowAfter 1 minute, CancelAfter at once). With no
	// Logger, Add uses the manager's logger named "quiesce"; New discards the log.
	drain.Options

	// GracePeriod bounds how long Start waits, once its context ended, for the tracked
	// calls to return. 0 or negative: 25s, below the manager's default
	// GracefulShutdownTimeout of 30s, so that the Runnable names what it abandons before
	// the manager gives up on it. Keep it below GracefulShutdownTimeout (see the README,
	// "Deploying"). It is measured on real time (the time package), not on Options.Clock.
	GracePeriod time.Duration

	// NeedLeaderElection is what NeedLeaderElection returns. nil: true (see
	// Runnable.NeedLeaderElection for why).
	NeedLeaderElection *bool
}

// DefaultGracePeriod is the GracePeriod used when Options leave it zero.
const DefaultGracePeriod = 25 * time.Second

// Runnable is a manager.Runnable that owns a drain.Executor and drains it when the manager
// stops. Create it with New or Add; all its methods are safe for concurrent use.
type Runnable struct {
	ex      *drain.Executor
	log     logr.Logger
	clock   clock.PassiveClock // the executor's: calls are stamped with it
	grace   time.Duration
	elected bool
	metered bool // created by Add: in the metrics until Start returns

	started atomic.Bool
	stopped chan struct{} // closed when Start returned
	err     error         // what Start returned; written before stopped is closed
}

// DebugPath is where Add serves ServeHTTP on the manager's metrics server.
const DebugPath = "/debug/quiesce"

var (
	_ manager.Runnable               = (*Runnable)(nil)
	_ manager.LeaderElectionRunnable = (*Runnable)(nil)
	_ http.Handler                   = (*Runnable)(nil)
)

// New returns a Runnable owning a new executor configured by opts.Options. It is not added
// to a manager: Add does that, with its readyz check, metrics and debug handler.
//
// Once the Runnable is added (Add) or started, the executor is driven: the contexts of the
// reconciles wrapped with reconcilers.Wrap end by its drain, not by their caller's
// cancellation (see Options.CancelAfter). New alone changes no context.
func New(opts Options) *Runnable { return newRunnable(opts, false) }

func newRunnable(opts Options, metered bool) *Runnable {
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	elected := true
	if opts.NeedLeaderElection != nil {
		elected = *opts.NeedLeaderElection
	}
	var clk clock.PassiveClock = clock.RealClock{}
	if opts.Clock != nil {
		clk = opts.Clock
	}
	ex := drain.New(opts.Options)
	// Fixed here, before the executor is shared: a reconcile gets the same context policy
	// whether it starts before or after the manager starts the Runnable, and every call of
	// a metered executor is observed.
	if metered {
		internal.Of(ex).Settings().AfterCall = observeCall
	}
	return &Runnable{
		ex:      ex,
		log:     opts.Logger,
		clock:   clk,
		grace:   opts.GracePeriod,
		elected: elected,
		metered: metered,
		stopped: make(chan struct{}),
	}
}

// Add creates a Runnable as New does and adds it to mgr, with ReadyzCheck as the readyz
// check "quiesce", the executor's metrics in controller-runtime's metrics.Registry, and
// the Runnable itself (ServeHTTP) at DebugPath on the manager's metrics server, behind its
// FilterProvider like /metrics. It must be called before mgr.Start, once per manager.
//
// The metrics hold the executor until Start returns, then keep only its counters.
func Add(mgr manager.Manager, opts Options) (*Runnable, error) {
	if mgr == nil {
		return nil, errors.New("failed to add quiesce runnable: nil manager")
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = mgr.GetLogger().WithName("quiesce")
	}
	r := newRunnable(opts, true)
	internal.Of(r.ex).Settings().Driven.Store(true)
	// Tracked before mgr.Add, which may start r at once: a Start that returned before it
	// was tracked would leave it tracked for good.
	stats.track(r)
	if err := mgr.Add(r); err != nil {
		stats.fold(r)
		return nil, fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if err := mgr.AddReadyzCheck("quiesce", r.ReadyzCheck); err != nil {
		return nil, fmt.Errorf("failed to add quiesce readyz check: %w", err)
	}
	if err := mgr.AddMetricsServerExtraHandler(DebugPath, r); err != nil {
		return nil, fmt.Errorf("failed to add quiesce debug handler: %w", err)
	}
	return r, nil
}

// Executor returns the executor the Runnable owns and drains. Pass it to reconcilers.Wrap.
func (r *Runnable) Executor() *drain.Executor { return r.ex }

// NeedLeaderElection reports whether the manager starts the Runnable only once elected.
//
// It is true by default, and should stay so where the controllers need leader election:
// controller-runtime stops the runnables that do not need leader election first, while
// the controllers still dequeue and reconcile, so an executor in that group would drain
// (and refuse work) while the controllers feeding it still run. In the leader-election
// group, the executor stops together with the controllers that feed it, and the
// controllers' wait for their reconciles and the executor's drain share one grace period.
func (r *Runnable) NeedLeaderElection() bool { return r.elected }

// ReadyzCheck is a healthz.Checker that fails from the moment the executor drains, so that
// a Service stops sending work to a pod that is shutting down.
func (r *Runnable) ReadyzCheck(*http.Request) error {
	if r.draining() {
		return errors.New("quiesce executor is draining")
	}
	return nil
}

// Start blocks until ctx ends. Then it drains the executor: it refuses new calls and
// waits up to GracePeriod for the tracked ones to return, while the executor logs what it
// still waits for. It returns nil when every call returned. Otherwise it logs the calls it
// abandoned as one error line (the oldest 20, and how many more) and returns an error
// that counts them, points at the log, and wraps the *drain.PendingError listing them
// all (errors.As), itself wrapping context.DeadlineExceeded; with no Logger, it logs
// nothing and returns the *drain.PendingError itself. A Runnable starts once: a second
// Start, or a Start after its executor drained, returns an error at once.
func (r *Runnable) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("failed to start quiesce runnable: already started")
	}
	internal.Of(r.ex).Settings().Driven.Store(true)
	select {
	case <-r.ex.Draining():
		r.finish(errors.New("failed to start quiesce runnable: its executor already drained"))
		return r.err
	default:
	}
	<-ctx.Done()
	r.finish(r.drain())
	return r.err
}

// drain is the stop procedure, one step at a time.
func (r *Runnable) drain() error {
	pending := r.ex.Stats().InFlight
	log := r.log.WithValues("gracePeriod", r.grace.String())
	// Say nothing at the default verbosity when nothing is pending, as the reports do.
	info := log.V(1)
	if pending > 0 {
		info = log
	}

	// Step 1: refuse new calls and wait for the tracked ones, within the grace period.
	// Reports of pending calls come from the executor while it waits.
	info.Info("Draining executor", "pending", pending)
	ctx, cancel := context.WithTimeout(context.Background(), r.grace)
	defer cancel()
	start := time.Now()
	err := r.ex.Drain(ctx)
	if r.metered {
		drainSeconds.Observe(time.Since(start).Seconds())
	}

	// Step 2: every call returned: done.
	if err == nil {
		info.Info("All calls returned")
		return nil
	}

	// Step 3: the grace period ran out: name the calls abandoned, in one line.
	var pe *drain.PendingError
	if !errors.As(err, &pe) {
		log.Error(err, "Failed to drain executor")
		return err
	}
	return r.abandon(log, pe)
}

// abandonedMsg is the message of the line that lists the abandoned calls.
const abandonedMsg = "Abandoned calls still running after the grace period"

// abandon logs the calls of pe, bounded like the executor's reports, and returns the error
// for Start.
//
// The list appears once in the log, on this line. Before, it appeared three times: this
// line's list, this line's error, and controller-runtime's copy of Start's error ("error
// received after stop sequence was engaged"), plus once more when main logs Err. This line
// reads best: it comes right after the reports, in their format (name, age, detached,
// where, handler), under a message that says what happened. So the error only counts the
// calls and says that the log lists them (without quoting this line's message, so that a
// search for it finds this line alone); the complete list stays in the *drain.PendingError
// it wraps, for code. With no logger (New without Options.Logger) there is no such line, and
// Start returns pe itself, whose text lists them.
func (r *Runnable) abandon(log logr.Logger, pe *drain.PendingError) error {
	if r.log.GetSink() == nil {
		return pe
	}
	now := r.clock.Now()
	n := min(len(pe.Pending), maxListed)
	calls := make([]call, n)
	for i, p := range pe.Pending[:n] {
		calls[i] = callOf(p, now)
	}
	kv := []any{"abandoned", len(pe.Pending), "calls", calls}
	if more := len(pe.Pending) - n; more > 0 {
		kv = append(kv, "more", more)
	}
	log.Error(pe.Err, abandonedMsg, kv...)
	return &abandonedError{pending: pe, grace: r.grace}
}

// maxListed bounds how many abandoned calls the log line lists, as drain bounds its reports.
const maxListed = 20

// abandonedError is Start's error when calls were abandoned and logged.
type abandonedError struct {
	pending *drain.PendingError
	grace   time.Duration
}

func (e *abandonedError) Error() string {
	return fmt.Sprintf("failed to drain quiesce executor: %v: "+
		"%d call(s) still running after the grace period of %v, listed in quiesce's log",
		e.pending.Err, len(e.pending.Pending), e.grace)
}

// Unwrap returns the *drain.PendingError that lists every abandoned call.
func (e *abandonedError) Unwrap() error { return e.pending }

// finish records Start's result, and, for a Runnable created by Add, folds its executor's
// counters into the metrics' totals so that they no longer hold it.
func (r *Runnable) finish(err error) {
	r.err = err
	if r.metered {
		stats.fold(r)
	}
	close(r.stopped)
}

// Done returns a channel closed when Start returned.
func (r *Runnable) Done() <-chan struct{} { return r.stopped }

// Err returns what Start returned, once Done is closed: nil when every call returned, or
// an error wrapping the *drain.PendingError naming the abandoned calls (see Start). Before
// that it returns nil.
//
// controller-runtime does not return a runnable's error from mgr.Start once the manager
// is stopping, so main uses Err to learn that calls were abandoned, e.g. to exit non-zero:
//
//	if err := mgr.Start(ctx); err != nil { ... }
//	if err := q.Err(); err != nil { os.Exit(1) }
func (r *Runnable) Err() error {
	select {
	case <-r.stopped:
		return r.err
	default:
		return nil
	}
}
