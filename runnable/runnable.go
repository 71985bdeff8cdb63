package runnable

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// Options configure a Runnable. The zero value is valid: every zero field means the
// documented default. Setup returns an error naming the field (or its flag, or its path in
// the config file) for a bad value; New panics on the same values.
type Options struct {
	// Logger receives the drain's reports and the stop's timeline. Zero (or logr.Discard()):
	// the manager's Logger (Setup), else controller-runtime's log.Log, named "quiesce". To
	// discard, pass logr.New(log.NullLogSink{}).
	Logger logr.Logger

	// MaxConcurrent bounds the reconciles (and the calls nested in them) running at once;
	// others wait for a slot. 0: unbounded. Daemons and webhook calls take no slot.
	MaxConcurrent int

	// ReportAfter is when, in the drain, the first report of the pending calls is logged;
	// ReportEvery, how often later ones are. 0: 1s and 5s; a positive value below
	// drain.MinReportAfter (100ms) or drain.MinReportEvery (500ms) is refused: each report
	// captures every goroutine's stack.
	ReportAfter, ReportEvery time.Duration

	// SlowAfter: outside a drain, calls running longer are logged as slow. 0: 1m;
	// negative: never; a positive value below drain.MinSlowAfter (1s) is refused.
	SlowAfter time.Duration

	// CancelAfter is how long, once the drain began, the contexts of the calls still
	// running live, so that in-flight reconciles finish and calls that ignore their
	// context leave time for the last report. 0: 4/5 of GracePeriod; > 0: below
	// GracePeriod; drain.CancelAtOnce: at once, as controller-runtime alone; negative: never.
	CancelAfter time.Duration

	// GracePeriod bounds the drain, counted from the manager's stop (the end of
	// ShutdownDelay) on real time. 0 or negative: 25s. It must be below the manager's
	// GracefulShutdownTimeout (30s when unset), so that the abandoned calls are named
	// before the manager gives up.
	GracePeriod time.Duration

	// ShutdownDelay is how long everything keeps serving once the stop began (SIGTERM)
	// while readiness fails on every replica, before the manager's stop; default 0 (then
	// readiness never fails). It needs mgr.Start(q.StopContext(ctx)). Timed on Clock.
	// ShutdownDelay + GracePeriod must fit in terminationGracePeriodSeconds (see
	// docs/operating.md).
	ShutdownDelay time.Duration

	// DebugAddress, if set, serves DebugPath on a listener of its own at this address, which
	// must be a loopback one ("127.0.0.1:8083", "[::1]:8083", "localhost:8083"): reach it with
	// kubectl port-forward. For operators whose metrics server has no FilterProvider. Its
	// flag is --quiesce-debug-address. "": none.
	DebugAddress string

	// DebugWithoutFilter serves DebugPath on a metrics server without a FilterProvider, to
	// anyone who reaches the metrics port.
	//
	// Deprecated: use DebugAddress, which serves it on loopback only. Removed in a later release.
	DebugWithoutFilter bool

	// Clock stamps the calls and times the reports, CancelAfter and ShutdownDelay (not
	// GracePeriod). nil: clock.RealClock{}.
	Clock clock.WithTickerAndDelayedExecution

	flagsBound   bool   // BindFlags bound the durations: errors name their flags
	fromConfig   bool   // set by Config.Apply: errors name the fields by their path in the file
	configPrefix string // that path's prefix, e.g. "quiesce."
}

// DefaultGracePeriod is the GracePeriod used when Options leave it zero.
const DefaultGracePeriod = 25 * time.Second

// DebugPath is where the Runnable serves ServeHTTP: on the manager's metrics server, and on
// Options.DebugAddress.
const DebugPath = "/debug/quiesce"

// Runnable is a manager.Runnable that owns a drain.Executor and drains it when the manager
// stops. Make it with Setup (or New, without a manager); its methods are safe for concurrent use.
type Runnable struct {
	ex      *drain.Executor
	log     logr.Logger
	clock   clock.WithTickerAndDelayedExecution // the executor's: stamps calls, times ShutdownDelay
	grace   time.Duration
	metered bool // made by Setup: in the metrics until the drain is over
	// eventsBudget bounds how long the Observers (Events) may take over the abandoned calls.
	eventsBudget time.Duration
	lease        atomic.Pointer[leaseObserver] // set by Add when leader election is on
	elected      <-chan struct{}               // the manager's Elected, with the lease set
	misuse       chan error                    // the lock of Setup saw a misuse: Start returns it

	stop  *stopState  // see stop.go
	debug debugView   // see debug.go
	setup *setupState // see setup.go

	started      atomic.Bool
	drainStarted atomic.Bool
	drainOnce    sync.Once
	stopped      chan struct{} // closed when the drain is over
	err          error         // the drain's result; written before stopped is closed
}

var (
	_ manager.Runnable               = (*Runnable)(nil)
	_ manager.LeaderElectionRunnable = (*Runnable)(nil)
	_ http.Handler                   = (*Runnable)(nil)
)

// New returns a Runnable owning a new executor, for unit tests and libraries that have no
// manager: it drains when the context given to Start ends. In an operator use Setup, which
// also fences calls on a lost lease, tracks admission and adds the readyz check, metrics and
// debug view. The contexts of reconciles wrapped with its executor end by its drain, not by
// their caller's cancellation (see the package documentation, "The shield").
//
// New panics on the Options that Setup refuses with an error (ignoring DebugAddress).
func New(opts Options) *Runnable {
	if err := checkDurations(opts); err != nil {
		panic("runnable.New: " + err.Error())
	}
	return newRunnable(withDefaults(opts), false)
}

// withDefaults fills in the documented defaults of opts.
func withDefaults(opts Options) Options {
	if internal.NoLogger(opts.Logger) {
		opts.Logger = logf.Log.WithName("quiesce")
	}
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	if opts.CancelAfter == 0 {
		opts.CancelAfter = opts.GracePeriod / 5 * 4
	}
	return opts
}

func newRunnable(opts Options, metered bool) *Runnable {
	var clk clock.WithTickerAndDelayedExecution = clock.RealClock{}
	if !internal.IsNil(opts.Clock) {
		clk = opts.Clock
	}
	ex := drain.New(drain.Options{Logger: opts.Logger, MaxConcurrent: opts.MaxConcurrent,
		ReportAfter: opts.ReportAfter, ReportEvery: opts.ReportEvery, CancelAfter: opts.CancelAfter,
		SlowAfter: opts.SlowAfter, Clock: clk})
	r := &Runnable{ex: ex, log: opts.Logger, clock: clk, grace: opts.GracePeriod, metered: metered,
		eventsBudget: maxEventsBudget, misuse: make(chan error, 1), stopped: make(chan struct{}),
		stop: &stopState{delay: opts.ShutdownDelay, delayName: opts.name("ShutdownDelay"), stopping: make(chan struct{})}}
	// Fixed here, before the executor is shared.
	s := internal.Of(ex).Settings()
	s.Owned = true
	if metered {
		s.AfterCall = observeCall
	}
	s.StopKV = r.sinceStop
	s.DrainOver = func() <-chan struct{} {
		if !r.drainStarted.Load() { // set before the drain refuses anything: see startDrain
			return nil
		}
		return r.stopped
	}
	return r
}

func (r *Runnable) core() internal.Core { return internal.Of(r.ex) }

// checkDurations checks opts before their defaults are filled in, naming what to change.
func checkDurations(opts Options) error {
	grace := opts.GracePeriod
	if grace <= 0 {
		grace = DefaultGracePeriod
	}
	if opts.ShutdownDelay < 0 {
		return fmt.Errorf("%s is %v: set it to 0 (no delay) or more", opts.name("ShutdownDelay"), opts.ShutdownDelay)
	}
	if opts.CancelAfter > 0 && opts.CancelAfter >= grace {
		cancelAfter, gracePeriod := opts.name("CancelAfter"), opts.name("GracePeriod")
		return fmt.Errorf("%s (%v) must be below %s (%v): lower %s, or raise %s",
			cancelAfter, opts.CancelAfter, gracePeriod, grace, cancelAfter, gracePeriod)
	}
	for _, b := range []struct {
		field    string
		d, least time.Duration
	}{
		{"ReportAfter", opts.ReportAfter, drain.MinReportAfter},
		{"ReportEvery", opts.ReportEvery, drain.MinReportEvery},
		{"SlowAfter", opts.SlowAfter, drain.MinSlowAfter},
	} {
		if b.d > 0 && b.d < b.least {
			return fmt.Errorf("%s is %v: set it to 0 (the default) or at least %v", opts.name(b.field), b.d, b.least)
		}
	}
	return nil
}

// checkBudget checks GracePeriod against the manager's GracefulShutdownTimeout.
func checkBudget(opts Options, mo *manager.Options) error {
	grace, timeout := opts.GracePeriod, defaultGracefulShutdownTimeout
	if grace <= 0 {
		grace = DefaultGracePeriod
	}
	source := "controller-runtime's default, as the manager's Options set none"
	if mo.GracefulShutdownTimeout != nil {
		timeout, source = *mo.GracefulShutdownTimeout, "from the manager's Options"
	}
	if timeout >= 0 && grace >= timeout { // negative: the manager waits as long as it takes
		return fmt.Errorf("%s (%v) must be below the manager's GracefulShutdownTimeout (%v, %s): "+
			"raise GracefulShutdownTimeout in the manager's Options above %v, or lower %s",
			opts.name("GracePeriod"), grace, timeout, source, grace, opts.name("GracePeriod"))
	}
	return nil
}

// defaultGracefulShutdownTimeout is controller-runtime's default GracefulShutdownTimeout.
const defaultGracefulShutdownTimeout = 30 * time.Second

// maxEventsBudget bounds how long the Observers (reconcilers' Events) may take over the
// abandoned calls: they read each object from the API server.
const maxEventsBudget = 5 * time.Second

// eventsBudget is half the time between the end of the grace period and the manager's
// GracefulShutdownTimeout, at most maxEventsBudget: Start returns before the manager gives up.
func eventsBudget(grace time.Duration, mo *manager.Options) time.Duration {
	timeout := defaultGracefulShutdownTimeout
	if mo.GracefulShutdownTimeout != nil {
		timeout = *mo.GracefulShutdownTimeout
	}
	if timeout < 0 {
		return maxEventsBudget
	}
	return min(maxEventsBudget, (timeout-grace)/2)
}

// Executor returns the executor the Runnable owns and drains. Pass it to reconcilers.Wrap.
func (r *Runnable) Executor() *drain.Executor { return r.ex }

// NeedLeaderElection is false: the Runnable runs on every replica and controller-runtime
// stops it first, before the leader-election group. Fencing comes from the lease itself.
func (r *Runnable) NeedLeaderElection() bool { return false }

// ReadyzCheck is a healthz.Checker that fails from the moment the stop began when there is a
// ShutdownDelay, on every replica, so that Services stop routing to the pod while it still
// serves. With no delay it never fails, as without quiesce. controller-runtime logs its
// error at V(1) only.
func (r *Runnable) ReadyzCheck(*http.Request) error {
	if r.stop.delay > 0 && r.stop.began() {
		return fmt.Errorf("quiesce: shutting down: readiness fails for the %v shutdown delay so that "+
			"Services stop routing here; the operator keeps serving meanwhile", r.stop.delay)
	}
	return nil
}

// Start blocks until ctx ends, then drains: it refuses new calls, waits up to GracePeriod
// for the tracked ones (reconciles of both groups, their calls, daemons, webhook calls)
// while the executor reports them, and returns nil when all returned. Otherwise it logs the
// abandoned calls in one line (AbandonedMessage) and returns an error counting them that
// wraps the *drain.PendingError listing them all.
//
// It returns an error at once on a second Start, and when ShutdownDelay is set but the
// manager's context did not come from StopContext. It drains and returns an error naming
// the fix, which mgr.Start returns, as soon as the manager shows it was not made from the
// Options Setup prepared: it leads without the lock of Setup, or its leader election uses
// the lock Setup installed with leader election off (turned on after Setup). A lost lease
// starts the drain early, with every call's context ended.
func (r *Runnable) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("failed to start quiesce runnable: already started")
	}
	if r.stop.delay > 0 && !r.stop.delayed.Load() {
		return fmt.Errorf("failed to start quiesce runnable: %s is %v, "+
			"but the manager's context does not come from StopContext: start the manager with "+
			"mgr.Start(q.StopContext(ctx)), or set no %s", r.stop.delayName, r.stop.delay, r.stop.delayName)
	}
	if r.draining() && !r.drainStarted.Load() {
		r.drainOnce.Do(func() { r.finish(errors.New("failed to start quiesce runnable: its executor already drained")) })
		<-r.stopped
		return r.err
	}
	var misuse error
	elected := r.elected // nil without leader election: never
	for done := false; !done; {
		select {
		case misuse = <-r.misuse:
			done = true
		case <-elected:
			elected = nil
			if l := r.lease.Load(); l != nil && !l.used() {
				misuse, done = errLeadsWithoutLock, true
			}
		case <-ctx.Done():
			done = true
		}
	}
	r.beginStop()
	// The leader-election group, the caches and the webhooks stop once this returns.
	r.startDrain()
	<-r.stopped
	if misuse != nil {
		return misuse
	}
	return r.err
}

var errLeadsWithoutLock = errors.New("failed to start quiesce runnable: the manager leads without the lease " +
	"lock of runnable.Setup (it was made before Setup, or from a copy of the Options with another lock or with " +
	"leader election off), so a lost lease would fence nothing: call runnable.Setup(cfg, &mgrOpts, opts) " +
	"before ctrl.NewManager(cfg, mgrOpts), with the same mgrOpts")

// stopLog is the logger of the stop's lines: at the default verbosity when the stop waits
// (a ShutdownDelay, or calls pending), at V(1) otherwise, as kopf says nothing when nothing
// is pending.
func (r *Runnable) stopLog() logr.Logger {
	if r.stop.delay > 0 || r.stop.waited.Load() {
		return r.log
	}
	return r.log.V(1)
}

// drain is the stop procedure, one step at a time.
func (r *Runnable) drain() error {
	pending := r.ex.Stats().InFlight
	if pending > 0 {
		r.stop.waited.Store(true)
	}
	log := r.stopLog().WithValues("gracePeriod", r.grace.String())

	// Step 1: refuse new calls and wait for the tracked ones within the grace period; the
	// executor reports what is pending meanwhile.
	log.Info("Draining executor", append(r.sinceStop(), "pending", pending)...)
	ctx, cancel := context.WithTimeout(context.Background(), r.grace)
	defer cancel()
	start := time.Now()
	err := r.ex.Drain(ctx)
	if r.metered {
		drainSeconds.Observe(time.Since(start).Seconds())
	}
	if err == nil {
		log.Info("All calls returned", r.sinceStop()...)
		return nil
	}

	// Step 2: the grace period ran out: name the abandoned calls in one line.
	var pe *drain.PendingError
	if !errors.As(err, &pe) {
		log.Error(err, "Failed to drain executor")
		return err
	}
	calls, _ := r.core().Entries(internal.MaxListed)
	kv := append(r.sinceStop(), "abandoned", len(pe.Pending), "calls", calls)
	if more := len(pe.Pending) - len(calls); more > 0 {
		kv = append(kv, "more", more)
	}
	log.Error(pe.Err, AbandonedMessage, kv...)

	// Step 3: tell the executor's observers (reconcilers' Events on each abandoned object),
	// within a budget that leaves the manager time to return.
	ectx, ecancel := context.WithTimeout(context.Background(), r.eventsBudget)
	defer ecancel()
	r.core().Abandoned(ectx)
	return &abandonedError{pending: pe, grace: r.grace, delay: r.stop.delay}
}

// AbandonedMessage is the message of the error line naming the calls abandoned at the end
// of the grace period: alert on it (shutdowntest reads it).
const AbandonedMessage = "Abandoned calls still running after the grace period"

// abandonedError is Start's error when calls were abandoned: it counts them (the log lists
// them) and wraps the *drain.PendingError.
type abandonedError struct {
	pending      *drain.PendingError
	grace, delay time.Duration
}

func (e *abandonedError) Error() string {
	after := ""
	if e.delay > 0 {
		after = fmt.Sprintf(", after the %v shutdown delay", e.delay)
	}
	return fmt.Sprintf("failed to drain quiesce executor: %v: "+
		"%d call(s) still running after the grace period of %v%s, listed in quiesce's log",
		e.pending.Err, len(e.pending.Pending), e.grace, after)
}

func (e *abandonedError) Unwrap() error { return e.pending }

// finish records the drain's result and folds the executor's counters into the metrics'
// totals, so that they no longer hold it.
func (r *Runnable) finish(err error) {
	r.err = err
	if r.metered {
		stats.fold(r)
	}
	close(r.stopped)
}

// Done returns a channel closed when the drain is over, as Start returns.
func (r *Runnable) Done() <-chan struct{} { return r.stopped }

// Err returns the drain's result once Done is closed (nil before): nil when every call
// returned, or Start's error. controller-runtime does not return a runnable's error from
// mgr.Start once it is stopping, so main asks Err, e.g. to exit non-zero:
//
//	if err := mgr.Start(q.StopContext(ctx)); err != nil { ... }
//	if err := q.Err(); err != nil { os.Exit(1) }
func (r *Runnable) Err() error {
	select {
	case <-r.stopped:
		return r.err
	default:
		return nil
	}
}

// draining reports whether the executor's drain began.
func (r *Runnable) draining() bool {
	select {
	case <-r.ex.Draining():
		return true
	default:
		return false
	}
}
