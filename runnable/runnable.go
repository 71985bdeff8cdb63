package runnable

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/internal/claims"
)

// Options configure a Runnable; the zero value means every documented default. Setup
// refuses a bad value naming the field (or its flag, or its config path); New panics.
type Options struct {
	// Logger receives the reports and the stop's timeline. Zero (logr.Discard() too): the
	// manager's Logger, else log.Log, named "quiesce"; to discard: logr.New(log.NullLogSink{}).
	Logger logr.Logger

	// MaxConcurrent bounds the reconciles (and the calls nested in them) running at once;
	// others wait for a slot. 0: unbounded. Daemons and webhook calls take no slot.
	MaxConcurrent int

	// ReportAfter is when the drain's first report of pending calls comes; ReportEvery, how
	// often later ones do. 0: 1s and 5s; at least drain.MinReportAfter and drain.MinReportEvery.
	ReportAfter, ReportEvery time.Duration

	// SlowAfter: outside a drain, calls running longer are logged as slow. 0: 1m; negative:
	// never; else at least drain.MinSlowAfter (1s).
	SlowAfter time.Duration

	// CancelAfter is how long, once the drain began, the contexts of running calls live, so
	// that in-flight reconciles finish. 0: 4/5 of GracePeriod; > 0: below GracePeriod;
	// drain.CancelAtOnce: at once, as controller-runtime alone; negative: never.
	CancelAfter time.Duration

	// GracePeriod bounds the drain, from the manager's stop, on real time. 0 or negative: 25s.
	// Below the manager's GracefulShutdownTimeout (30s when unset), so that the abandoned
	// calls are named before the manager gives up.
	GracePeriod time.Duration

	// ShutdownDelay is how long everything keeps serving after SIGTERM, readiness failing on
	// every replica, before the manager's stop (see StopContext); 0: none, and readiness
	// never fails. Timed on Clock. See docs/operating.md for the budget.
	ShutdownDelay time.Duration

	// TerminationGracePeriod is how long the process has from SIGTERM to SIGKILL: the Pod's
	// terminationGracePeriodSeconds (less a preStop hook's time), or systemd's TimeoutStopSec.
	// When set, Setup refuses a ShutdownDelay plus the manager's GracefulShutdownTimeout that
	// is not below it. 0: unknown, not checked. See docs/operating.md.
	TerminationGracePeriod time.Duration

	// DebugAddress serves DebugPath on a listener of its own at this loopback address
	// ("127.0.0.1:8083", "[::1]:8083", "localhost:8083"), reached with kubectl port-forward,
	// for a metrics server without a FilterProvider. Add refuses a listener whose own address
	// is not loopback (a host name may resolve elsewhere). "": none.
	DebugAddress string

	// Clock stamps calls and times reports, CancelAfter and ShutdownDelay. nil: the real clock.
	Clock clock.WithTickerAndDelayedExecution

	flagsBound   bool   // BindFlags bound the durations: errors name their flags
	fromConfig   bool   // set by Config.Apply: errors name the fields by their path in the file
	configPrefix string // that path's prefix, e.g. "quiesce."
}

// DefaultGracePeriod is the GracePeriod used when Options leave it zero.
const DefaultGracePeriod = 25 * time.Second

// DebugPath is where Add serves ServeHTTP.
const DebugPath = "/debug/quiesce"

// Runnable is a manager.Runnable that owns a drain.Executor and drains it when the manager
// stops. Make it with Setup and add it with Runnable.Add.
type Runnable struct {
	ex           *drain.Executor
	log          logr.Logger
	clock        clock.WithTickerAndDelayedExecution // the executor's: stamps calls, times ShutdownDelay
	grace        time.Duration
	cancelAfter  time.Duration                 // Options.CancelAfter, defaulted
	metered      bool                          // made by Setup: in the metrics until the drain is over
	eventsBudget time.Duration                 // see maxEventsBudget
	lease        atomic.Pointer[leaseObserver] // set by Add with leader election on
	elected      <-chan struct{}               // the manager's Elected, with lease
	misuse       chan error                    // a misuse seen by a lock: Start returns it
	claims       *claims.Registry              // reconcilers.HandOffAtStop's; nil without a lease namespace

	stop  *stopState                     // see stop.go
	debug flowcontrol.PassiveRateLimiter // ServeHTTP's
	setup *setupState                    // see setup.go

	fenceOnce    sync.Once   // see fence
	fenced       atomic.Bool // the fence began: no lock of r writes the lease
	started      atomic.Bool
	drainStarted atomic.Bool
	drainOnce    sync.Once
	stopped      chan struct{} // closed when the drain is over
	err          error         // the drain's result; written before stopped is closed
}

var _ manager.LeaderElectionRunnable = (*Runnable)(nil) // manager.Runnable and http.Handler: see Add

// Runner owns an executor and drains it when the context given to Run ends, without a
// manager: for unit tests and libraries. It is not a manager.Runnable, so that it cannot be
// given to mgr.Add, where no lease would fence its shielded calls (docs/design.md, "Seams").
type Runner struct{ r *Runnable }

// New returns a Runner owning a new executor. In an operator use Setup, which also fences,
// tracks admission and adds readiness, metrics and the debug view. It panics on the Options
// that Setup refuses (DebugAddress aside).
func New(opts Options) *Runner {
	if err := checkDurations(opts); err != nil {
		panic("runnable.New: " + err.Error())
	}
	return &Runner{r: newRunnable(withDefaults(opts), false)}
}

// Run blocks until ctx ends, then drains the executor within GracePeriod, as a Runnable's
// Start does, and returns the same result. It fails at once when called a second time.
func (r *Runner) Run(ctx context.Context) error { return r.r.Start(ctx) }

// Executor returns the executor the Runner owns and drains.
func (r *Runner) Executor() *drain.Executor { return r.r.ex }

// Done returns a channel closed when the drain is over, as Run returns.
func (r *Runner) Done() <-chan struct{} { return r.r.stopped }

// Err returns the drain's result once Done is closed (nil before).
func (r *Runner) Err() error { return r.r.Err() }

// withDefaults fills in the documented defaults of opts.
func withDefaults(opts Options) Options {
	if internal.NoLogger(opts.Logger) {
		opts.Logger = logf.Log.WithName("quiesce")
	}
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	opts.CancelAfter = cmp.Or(opts.CancelAfter, opts.GracePeriod/5*4)
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
		cancelAfter: opts.CancelAfter, eventsBudget: maxEventsBudget,
		misuse: make(chan error, 1), stopped: make(chan struct{}),
		debug: flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(debugRate, debugBurst, clk),
		stop:  &stopState{delay: opts.ShutdownDelay, delayName: opts.name("ShutdownDelay"), stopping: make(chan struct{})}}
	// Fixed here, before the executor is shared.
	s := internal.Of(ex).Settings()
	s.Owned = true
	s.Grace = opts.GracePeriod
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

// checkDurations checks opts before their defaults are filled in.
func checkDurations(opts Options) error {
	grace := withDefaults(opts).GracePeriod
	if opts.TerminationGracePeriod < 0 {
		return fmt.Errorf("%s is %v: set it to 0 (not checked) or more",
			opts.name("TerminationGracePeriod"), opts.TerminationGracePeriod)
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
	}{{"ReportAfter", opts.ReportAfter, drain.MinReportAfter}, {fieldReportEvery, opts.ReportEvery, drain.MinReportEvery},
		{fieldSlowAfter, opts.SlowAfter, drain.MinSlowAfter}} {
		if b.d > 0 && b.d < b.least {
			return fmt.Errorf("%s is %v: set it to 0 (the default) or at least %v", opts.name(b.field), b.d, b.least)
		}
	}
	return nil
}

// shutdownTimeout is the manager's GracefulShutdownTimeout (negative: none), and its source.
func shutdownTimeout(mo *manager.Options) (time.Duration, string) {
	if mo.GracefulShutdownTimeout != nil {
		return *mo.GracefulShutdownTimeout, "from the manager's Options"
	}
	return 30 * time.Second, "controller-runtime's default, as the manager's Options set none"
}

// checkBudget checks GracePeriod against the manager's GracefulShutdownTimeout, and that
// with ShutdownDelay against TerminationGracePeriod.
func checkBudget(opts Options, mo *manager.Options) error {
	grace := withDefaults(opts).GracePeriod
	if timeout, source := shutdownTimeout(mo); timeout >= 0 && grace >= timeout {
		return fmt.Errorf("%s (%v) must be below the manager's GracefulShutdownTimeout (%v, %s): "+
			"raise the manager's GracefulShutdownTimeout above %v (ctrl.Options.GracefulShutdownTimeout, or the "+
			"operator's own flag or setting for it), or lower %s",
			opts.name("GracePeriod"), grace, timeout, source, grace, opts.name("GracePeriod"))
	}
	kill := opts.TerminationGracePeriod
	if kill <= 0 {
		return nil
	}
	timeout, source := shutdownTimeout(mo)
	need, what := opts.ShutdownDelay+timeout, "the manager's GracefulShutdownTimeout ("+timeout.String()+", "+source+")"
	if timeout < 0 { // no timeout: the drain still ends within GracePeriod
		need, what = opts.ShutdownDelay+grace, opts.name("GracePeriod")+" ("+grace.String()+")"
	}
	if need >= kill {
		return fmt.Errorf("%s (%v) plus %s must be below %s (%v), or the process is killed before its stop ends: "+
			"raise terminationGracePeriodSeconds (or TimeoutStopSec) and %s above %v",
			opts.name("ShutdownDelay"), opts.ShutdownDelay, what, opts.name("TerminationGracePeriod"), kill,
			opts.name("TerminationGracePeriod"), need)
	}
	return nil
}

// maxEventsBudget bounds how long the Observers (reconcilers' Events, which read each
// object) may take over the abandoned calls; Add also bounds it to half the time from the
// end of the grace period to the manager's GracefulShutdownTimeout.
const maxEventsBudget = 5 * time.Second

// Executor returns the executor the Runnable owns and drains. Pass it to reconcilers.Wrap.
func (r *Runnable) Executor() *drain.Executor { return r.ex }

// NeedLeaderElection is false: the Runnable runs on every replica and is stopped first.
func (r *Runnable) NeedLeaderElection() bool { return false }

// ReadyzCheck is a healthz.Checker that fails from the stop on when there is a
// ShutdownDelay, so that Services stop routing to the pod while it still serves.
func (r *Runnable) ReadyzCheck(*http.Request) error {
	if r.stop.delay > 0 && r.stop.began() {
		return fmt.Errorf("quiesce: shutting down: readiness fails for the %v shutdown delay so that "+
			"Services stop routing here; the operator keeps serving meanwhile", r.stop.delay)
	}
	return nil
}

// Start blocks until ctx ends, then drains (see the package documentation) and returns nil
// when every call returned, or an error counting the abandoned calls that wraps the
// *drain.PendingError listing them. It fails at once on a second Start, or with a
// ShutdownDelay when the manager's context is not StopContext's. It drains at once and
// returns an error naming the fix, which mgr.Start returns, when Add did not add it
// (mgr.Add(q) instead of q.Add(mgr) leaves the manager without the readyz check, metrics,
// debug view and lease check), and as soon as the manager shows it was not made from the
// Options Setup prepared: it leads without the lock of Setup, or leader election was turned
// on after Setup.
func (r *Runnable) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("failed to start quiesce runnable: already started")
	}
	if s := r.setup; s != nil && !s.attached.Load() {
		r.beginStop()
		r.startDrain()
		<-r.stopped
		return errNotAdded
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

var errNotAdded = errors.New("failed to start quiesce runnable: it was not added with q.Add(mgr): " +
	"call q.Add(mgr) instead of mgr.Add(q)")

var errLeadsWithoutLock = errors.New("failed to start quiesce runnable: the manager leads without the lease " +
	"lock of runnable.Setup (it was made before Setup, or from a copy of the Options with another lock or with " +
	"leader election off), so a lost lease would fence nothing: call runnable.Setup(cfg, &mgrOpts, opts) " +
	"before ctrl.NewManager(cfg, mgrOpts), with the same mgrOpts")

// stopLog logs the stop's lines at V(1) unless the stop waits (a delay, calls pending).
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

	// Step 1: refuse new calls, wait for the tracked ones (the executor reports them); beside
	// it, once new calls are refused, hand the lease over if HandOffAtStop's claims allow.
	log.Info("Draining executor", append(r.sinceStop(), "pending", pending)...)
	ctx, cancel := context.WithTimeout(context.Background(), r.grace)
	defer cancel()
	handed := make(chan int, 1)
	if r.claims != nil {
		defer r.claims.Stop() // abandoned work's claims expire by themselves
		go func() { handed <- r.handOver() }()
	} else {
		handed <- 0
	}
	start := time.Now()
	err := r.ex.Drain(ctx)
	if r.metered {
		drainSeconds.Observe(time.Since(start).Seconds())
	}
	if n := <-handed; n > 0 && err == nil {
		r.log.Info("Claimed work finished", append(r.sinceStop(), "claims", n)...)
	}
	if err == nil {
		if n := r.ex.Stats().Cancelled; n > 0 {
			log.Info("All calls returned after being cancelled", append(r.sinceStop(), "cancelled", n)...)
		} else {
			log.Info("All calls returned", r.sinceStop()...)
		}
		return nil
	}

	// Step 2: the grace period ran out: name the abandoned calls in one line.
	var pe *drain.PendingError
	if !errors.As(err, &pe) {
		log.Error(err, "Failed to drain executor")
		return err
	}
	calls, _ := r.core().Entries(internal.MaxListed)
	for i := range calls { // cancelled for its cleanup window, and still running
		calls[i].CleanupUnfinished = calls[i].Cleanup != ""
	}
	kv := append(r.sinceStop(), "abandoned", len(pe.Pending), "calls", calls)
	log.Error(pe.Err, AbandonedMessage, internal.More(kv, len(pe.Pending), len(calls))...)

	// Step 3: tell the executor's observers (Events on each abandoned object), within budget.
	ectx, ecancel := context.WithTimeout(context.Background(), r.eventsBudget)
	defer ecancel()
	r.core().Abandoned(ectx)
	after := ""
	if r.stop.delay > 0 {
		after = fmt.Sprintf(", after the %v shutdown delay", r.stop.delay)
	}
	return &abandonedError{pending: pe, msg: fmt.Sprintf("failed to drain quiesce executor: %v: %d call(s) still "+
		"running after the grace period of %v%s, listed in quiesce's log", pe.Err, len(pe.Pending), r.grace, after)}
}

// AbandonedMessage is the message of the line naming the abandoned calls (alert on it).
const AbandonedMessage = "Abandoned calls still running after the grace period"

// abandonedError counts the abandoned calls (the log lists them) and wraps the *drain.PendingError.
type abandonedError struct {
	pending *drain.PendingError
	msg     string
}

func (e *abandonedError) Error() string { return e.msg }
func (e *abandonedError) Unwrap() error { return e.pending }

// finish records the drain's result; the metrics keep the executor's counters, not it.
func (r *Runnable) finish(err error) {
	r.err = err
	stats.fold(r)
	close(r.stopped)
}

// Done returns a channel closed when the drain is over, as Start returns.
func (r *Runnable) Done() <-chan struct{} { return r.stopped }

// Err returns the drain's result once Done is closed (nil before). mgr.Start does not return
// a runnable's error once it is stopping: main asks Err, e.g. to exit non-zero.
func (r *Runnable) Err() error {
	if internal.Closed(r.stopped) {
		return r.err
	}
	return nil
}

// draining reports whether the executor's drain began.
func (r *Runnable) draining() bool { return internal.Closed(r.ex.Draining()) }
