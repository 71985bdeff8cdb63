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
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// Options configure a Runnable. The zero value is valid: every zero field means the
// documented default. New does not check Options; Add does, and returns an error naming
// the value to change.
type Options struct {
	// Logger receives the drain's reports and the stop's timeline. The zero value: Add uses
	// the manager's logger named "quiesce"; New discards the log.
	Logger logr.Logger

	// MaxConcurrent bounds the reconciles (and the calls nested in them) running at once;
	// others wait for a slot. 0: unbounded. Daemons and webhook calls take no slot.
	MaxConcurrent int

	// ReportAfter is when, in the drain, the first report of the pending calls is logged;
	// ReportEvery, how often later ones are. 0: 1s and 5s.
	ReportAfter, ReportEvery time.Duration

	// SlowAfter: outside a drain, calls running longer are logged as slow. 0: 1m;
	// negative: never.
	SlowAfter time.Duration

	// CancelAfter is how long, once the drain began, the contexts of the calls still
	// running live: in-flight reconciles get to finish, and calls that ignore their context
	// still leave time, before GracePeriod ends, for the last report and the line naming
	// what is abandoned. 0: 4/5 of GracePeriod (20s of the default 25s); > 0: below
	// GracePeriod (Add checks it); negative: never cancelled. controller-runtime alone
	// cancels at once; time.Nanosecond does the same here.
	CancelAfter time.Duration

	// GracePeriod bounds the drain: how long, once the manager's stop began, quiesce waits
	// for the tracked calls to return before it names the ones it abandons. 0 or
	// negative: 25s, below the manager's default GracefulShutdownTimeout of 30s, so that
	// the abandoned calls are named before the manager gives up. Add checks that it is
	// below GracefulShutdownTimeout. It counts from the end of ShutdownDelay (the
	// manager's stop) and is measured on real time, not on Options.Clock.
	GracePeriod time.Duration

	// ShutdownDelay is how long everything keeps serving once the stop began (SIGTERM),
	// before the manager's stop begins; default 0. It needs the manager started with
	// StopContext (mgr.Start(q.StopContext(ctx))); Add's stop procedure fails to start
	// otherwise. From SIGTERM on, ReadyzCheck fails on every replica, leader and
	// standbys, so that Services stop routing to the pod, while webhooks, controllers
	// (with and without leader election), probes and metrics keep serving; a
	// WebhookServer answers with "Connection: close" so that the API server's keep-alive
	// connections move to another replica. Then the manager stops, and the drain proceeds
	// within GracePeriod. Set it to a few readiness probe periods (see the README,
	// "Rolling updates"); terminationGracePeriodSeconds must cover ShutdownDelay +
	// GracefulShutdownTimeout. Negative: Add fails. With no delay, ReadyzCheck never fails:
	// a single replica stays in its Service until its webhooks stop, as without quiesce.
	// A second SIGTERM during the delay still exits at once (ctrl.SetupSignalHandler).
	// It is timed on Options.Clock.
	ShutdownDelay time.Duration

	// ManagerOptions are the Options given to ctrl.NewManager, if known. Add reads:
	// GracefulShutdownTimeout (nil: controller-runtime's default, 30s; negative: no
	// limit) to check GracePeriod against it; Metrics.BindAddress, to say once when
	// /debug/quiesce cannot be served ("0": the metrics server is off); and WebhookServer,
	// which Add connects to the Runnable when it is a WebhookServer. nil: Add assumes
	// controller-runtime's defaults, and a WebhookServer stays unconnected (its Start
	// fails).
	ManagerOptions *manager.Options

	// NeedLeaderElection is what NeedLeaderElection returns. nil: true (see
	// Runnable.NeedLeaderElection for why).
	NeedLeaderElection *bool

	// Clock stamps the calls and times the reports, CancelAfter and ShutdownDelay (not
	// GracePeriod, on real time). nil: clock.RealClock{}.
	Clock clock.WithTickerAndDelayedExecution
}

// DefaultGracePeriod is the GracePeriod used when Options leave it zero.
const DefaultGracePeriod = 25 * time.Second

// defaultCancelAfter is CancelAfter when Options leave it zero: 4/5 of the grace period.
func defaultCancelAfter(grace time.Duration) time.Duration { return grace / 5 * 4 }

// Runnable is a manager.Runnable that owns a drain.Executor and drains it when the manager
// stops. Create it with New or Add; all its methods are safe for concurrent use.
type Runnable struct {
	ex      *drain.Executor
	log     logr.Logger
	clock   clock.WithTickerAndDelayedExecution // the executor's: stamps calls, times ShutdownDelay
	grace   time.Duration
	elected bool
	metered bool // created by Add: in the metrics until the drain is over

	stop  *stopState // see stop.go
	debug debugView  // see debug.go

	started      atomic.Bool
	drainStarted atomic.Bool // the Runnable's drain began
	drainOnce    sync.Once
	stopped      chan struct{} // closed when the drain is over
	err          error         // the drain's result; written before stopped is closed
}

// DebugPath is where Add serves ServeHTTP on the manager's metrics server.
const DebugPath = "/debug/quiesce"

var (
	_ manager.Runnable               = (*Runnable)(nil)
	_ manager.LeaderElectionRunnable = (*Runnable)(nil)
	_ http.Handler                   = (*Runnable)(nil)
)

// New returns a Runnable owning a new executor configured by opts. It is not added
// to a manager: Add does that, with its readyz check, metrics, debug handler and stop
// procedure (ShutdownDelay, the webhook server, standbys).
//
// The executor is the Runnable's from its creation: the contexts of the reconciles wrapped
// with reconcilers.Wrap end by its drain (Options.CancelAfter), not by controller-runtime's
// cancellation, so that in-flight work finishes; an executor of drain.New leaves contexts as
// they are. A Runnable of New drains only when the context given to its Start ends: it is
// for tests and programs without a manager. In a manager use Add, whose stop procedure
// drains on every replica as the manager's stop begins (mgr.Add(New(...)) would drain only
// with the leader-election group, after the controllers that need no leader election,
// which then wait for their shielded reconciles).
func New(opts Options) *Runnable { return newRunnable(withDefaults(opts), false) }

// withDefaults fills in the documented defaults of opts.
func withDefaults(opts Options) Options {
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	if opts.CancelAfter == 0 {
		opts.CancelAfter = defaultCancelAfter(opts.GracePeriod)
	}
	return opts
}

func newRunnable(opts Options, metered bool) *Runnable {
	elected := true
	if opts.NeedLeaderElection != nil {
		elected = *opts.NeedLeaderElection
	}
	var clk clock.WithTickerAndDelayedExecution = clock.RealClock{}
	if opts.Clock != nil {
		clk = opts.Clock
	}
	ex := drain.New(drain.Options{
		Logger:        opts.Logger,
		MaxConcurrent: opts.MaxConcurrent,
		ReportAfter:   opts.ReportAfter,
		ReportEvery:   opts.ReportEvery,
		CancelAfter:   opts.CancelAfter,
		SlowAfter:     opts.SlowAfter,
		Clock:         clk,
	})
	// Fixed here, before the executor is shared.
	internal.Of(ex).Settings().Owned = true
	if metered {
		internal.Of(ex).Settings().AfterCall = observeCall
	}
	r := &Runnable{
		ex:      ex,
		log:     opts.Logger,
		clock:   clk,
		grace:   opts.GracePeriod,
		elected: elected,
		metered: metered,
		stop: &stopState{
			delay:    opts.ShutdownDelay,
			stopping: make(chan struct{}),
		},
		stopped: make(chan struct{}),
	}
	internal.Of(ex).Settings().StopKV = r.sinceStop // before the executor is shared
	return r
}

// core returns the executor's internal.Core.
func (r *Runnable) core() internal.Core { return internal.Of(r.ex) }

// Add creates a Runnable as New does and adds it to mgr, with ReadyzCheck as the readyz
// check "quiesce", the executor's metrics in controller-runtime's metrics.Registry, the
// Runnable itself (ServeHTTP) at DebugPath on the manager's metrics server, behind its
// FilterProvider like /metrics, and its stop procedure: a small runnable that needs no
// leader election, so that it runs on every replica and the manager stops it first: the
// drain begins when the manager's stop begins, for every controller (see stop.go). It
// connects the manager's WebhookServer, if Options.ManagerOptions hold one.
//
// It must be called before mgr.Start, once per manager: a second Add on the same manager
// returns an error. It checks opts first, and
// returns an error naming the value to change when ShutdownDelay is negative, when
// CancelAfter > 0 is not below GracePeriod, or
// when GracePeriod is not below the manager's GracefulShutdownTimeout. An Add that fails
// adds nothing to mgr and leaves the WebhookServer unconnected, unless mgr itself refuses
// a runnable (it started already). When ManagerOptions say that the metrics server is off,
// it logs once that DebugPath is not served.
//
// The metrics hold the executor until the drain is over, then keep only its counters.
func Add(mgr manager.Manager, opts Options) (*Runnable, error) {
	if mgr == nil {
		return nil, errors.New("failed to add quiesce runnable: nil manager")
	}
	if err := validate(opts); err != nil {
		return nil, fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	var ws *webhookServer
	if opts.ManagerOptions != nil {
		ws, _ = opts.ManagerOptions.WebhookServer.(*webhookServer)
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = mgr.GetLogger().WithName("quiesce")
	}
	if err := register(); err != nil {
		return nil, err
	}
	opts = withDefaults(opts)
	r := newRunnable(opts, true)
	if ws != nil && !ws.connect(r) {
		return nil, errors.New("failed to add quiesce runnable: " +
			"its WebhookServer is connected to another Runnable already (use one WebhookServer per manager)")
	}
	if !added.claim(mgr) {
		if ws != nil {
			ws.disconnect(r)
		}
		return nil, errors.New("failed to add quiesce runnable: " +
			"this manager has one already (call runnable.Add once per manager)")
	}
	if err := mgr.AddReadyzCheck("quiesce", r.ReadyzCheck); err != nil {
		added.release(mgr)
		if ws != nil {
			ws.disconnect(r)
		}
		return nil, fmt.Errorf("failed to add quiesce readyz check: %w", err)
	}
	// Before mgr.Start: the Runnable's Start, in another group, must know, however the
	// goroutines of the groups are scheduled, that the stop procedure drains.
	r.stop.procedure.Store(true)
	// Tracked before mgr.Add, which may start r at once: a drain over before it was
	// tracked would leave it tracked for good.
	stats.track(r)
	if err := mgr.Add(&stopper{r: r}); err != nil {
		stats.fold(r)
		return nil, fmt.Errorf("failed to add quiesce stop procedure: %w", err)
	}
	if err := mgr.Add(r); err != nil {
		return nil, fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if mo := opts.ManagerOptions; mo != nil && mo.Metrics.BindAddress == "0" {
		r.log.Info("Not serving /debug/quiesce: the manager's metrics server is off", "path", DebugPath,
			"howToServe", "set Metrics.BindAddress in the manager's Options, "+
				"or serve the Runnable (an http.Handler) on a server of your own")
		return r, nil
	}
	if err := mgr.AddMetricsServerExtraHandler(DebugPath, r); err != nil {
		return nil, fmt.Errorf("failed to add quiesce debug handler: %w", err)
	}
	return r, nil
}

// defaultGracefulShutdownTimeout is controller-runtime's default GracefulShutdownTimeout.
const defaultGracefulShutdownTimeout = 30 * time.Second

// validate checks the options Add is given, before their defaults are filled in, and says
// which value to change.
func validate(opts Options) error {
	grace := opts.GracePeriod
	if grace <= 0 {
		grace = DefaultGracePeriod
	}
	if opts.ShutdownDelay < 0 {
		return fmt.Errorf("ShutdownDelay is %v: set it to 0 (no delay) or more", opts.ShutdownDelay)
	}
	if opts.CancelAfter > 0 && opts.CancelAfter >= grace {
		return fmt.Errorf("CancelAfter (%v) must be below GracePeriod (%v): lower CancelAfter, or raise GracePeriod",
			opts.CancelAfter, grace)
	}
	timeout := defaultGracefulShutdownTimeout
	source := "controller-runtime's default; pass the manager's Options as ManagerOptions if you set it"
	if mo := opts.ManagerOptions; mo != nil {
		source = "controller-runtime's default, as ManagerOptions set none"
		if mo.GracefulShutdownTimeout != nil {
			timeout, source = *mo.GracefulShutdownTimeout, "from ManagerOptions"
		}
	}
	if timeout < 0 { // the manager waits for its runnables as long as they take
		return nil
	}
	if grace >= timeout {
		return fmt.Errorf("GracePeriod (%v) must be below the manager's GracefulShutdownTimeout (%v, %s): "+
			"raise GracefulShutdownTimeout in the manager's Options above %v, or lower GracePeriod",
			grace, timeout, source, grace)
	}
	return nil
}

// Executor returns the executor the Runnable owns and drains. Pass it to reconcilers.Wrap.
func (r *Runnable) Executor() *drain.Executor { return r.ex }

// NeedLeaderElection reports whether the manager starts the Runnable only once elected
// (Options.NeedLeaderElection, true by default).
//
// Where the drain runs does not depend on it: for a Runnable created by Add, the stop
// procedure drains on every replica as the manager's stop begins. In the leader-election
// group (the default), the Runnable also fences: when the lease is lost, controller-runtime
// stops every group at once, with no grace, because another replica may lead already; the
// Runnable then ends the context of every tracked call at once ("Leadership lost:
// cancelling calls"), and they stay tracked and reported.
func (r *Runnable) NeedLeaderElection() bool { return r.elected }

// ReadyzCheck is a healthz.Checker that fails from the moment the stop began, when there is
// a ShutdownDelay (on every replica: see StopContext), so that Services stop sending work to
// a pod that is shutting down while it still serves. With no delay it never fails: a
// replica stays in its Service until its webhooks stop, as it would without quiesce.
//
// Its error says what it is. controller-runtime logs it at V(1) only ("healthz check
// failed", "checker": "quiesce"); at the default verbosity it logs one line per failed
// probe, "healthz check failed" with "statuses": [{}], which names no check: with
// periodSeconds p, a shutdown delay d costs about d/p such lines (2d/p at V(1)).
func (r *Runnable) ReadyzCheck(*http.Request) error {
	if r.stop.delay > 0 && r.stop.began() {
		return fmt.Errorf("quiesce: shutting down: readiness fails for the %v shutdown delay so that "+
			"Services stop routing here; the operator keeps serving meanwhile", r.stop.delay)
	}
	return nil
}

// Start blocks until ctx ends, then until the drain is over, and returns its result. It
// returns nil when every call returned. Otherwise it logs the calls it abandoned as one
// error line (the oldest 20, and how many more) and returns an error that counts them,
// points at the log, and wraps the *drain.PendingError listing them all (errors.As),
// itself wrapping context.DeadlineExceeded; with no Logger, it logs nothing and returns
// the *drain.PendingError itself.
//
// The drain refuses new calls and waits up to GracePeriod for the tracked ones to return,
// while the executor logs what it still waits for. For a Runnable created by Add, the stop
// procedure runs it as the manager's stop begins, on every replica, and Start, stopped
// later with the leader-election group, only waits for its end; if ctx ends while the
// drain is still going, controller-runtime did not wait for it: the lease was lost, and
// Start fences (see NeedLeaderElection). For a Runnable created by New, Start drains when
// ctx ends. A Runnable starts once: a second Start returns an error at once.
func (r *Runnable) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("failed to start quiesce runnable: already started")
	}
	select {
	case <-r.ex.Draining():
		if !r.drainStarted.Load() {
			r.drainOnce.Do(func() {
				r.finish(errors.New("failed to start quiesce runnable: its executor already drained"))
			})
			<-r.stopped
			return r.err
		}
	default:
	}
	<-ctx.Done()
	if r.elected && r.stop.procedure.Load() {
		select {
		case <-r.stopped: // the stop procedure drained: the normal stop
		default:
			r.fence()
		}
	}
	r.startDrain()
	<-r.stopped
	return r.err
}

// stopLog is the logger of the stop's lines: at the default verbosity when the stop waits
// (a ShutdownDelay, or calls pending when the stop or the drain began), at V(1) otherwise, as kopf says
// nothing when nothing is pending.
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

	// Step 1: refuse new calls and wait for the tracked ones, within the grace period.
	// Reports of pending calls come from the executor while it waits.
	log.Info("Draining executor", append(r.sinceStop(), "pending", pending)...)
	ctx, cancel := context.WithTimeout(context.Background(), r.grace)
	defer cancel()
	start := time.Now()
	err := r.ex.Drain(ctx)
	if r.metered {
		drainSeconds.Observe(time.Since(start).Seconds())
	}

	// Step 2: every call returned: done.
	if err == nil {
		log.Info("All calls returned", r.sinceStop()...)
		return nil
	}

	// Step 3: the grace period ran out: name the calls abandoned, in one line.
	var pe *drain.PendingError
	if !errors.As(err, &pe) {
		log.Error(err, "Failed to drain executor")
		return err
	}
	err = r.abandon(log, pe)

	// Step 4: tell the executor's observers (reconcilers.WrapOptions.Recorder queues an Event
	// on each abandoned reconcile's object), before Start and so mgr.Start return.
	r.core().Abandoned(context.Background())
	return err
}

// abandonedMsg is the message of the line that lists the abandoned calls.
const abandonedMsg = "Abandoned calls still running after the grace period"

// abandon logs the calls of pe, bounded like the executor's reports, and returns the error
// for Start. The list appears once in the log, on this line, in the reports' format; the
// error only counts the calls (controller-runtime and main log it again), and the complete
// list stays in the *drain.PendingError it wraps, for code. With no logger, Start returns pe
// itself, whose text lists them.
func (r *Runnable) abandon(log logr.Logger, pe *drain.PendingError) error {
	if r.log.GetSink() == nil {
		return pe
	}
	calls, _ := r.core().Entries(internal.MaxListed)
	kv := append(r.sinceStop(), "abandoned", len(pe.Pending), "calls", calls)
	if more := len(pe.Pending) - len(calls); more > 0 {
		kv = append(kv, "more", more)
	}
	log.Error(pe.Err, abandonedMsg, kv...)
	return &abandonedError{pending: pe, grace: r.grace, delay: r.stop.delay}
}

// abandonedError is Start's error when calls were abandoned and logged.
type abandonedError struct {
	pending *drain.PendingError
	grace   time.Duration
	delay   time.Duration // ShutdownDelay: the grace period counts from its end
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

// Unwrap returns the *drain.PendingError that lists every abandoned call.
func (e *abandonedError) Unwrap() error { return e.pending }

// finish records the drain's result, and, for a Runnable created by Add, folds its
// executor's counters into the metrics' totals so that they no longer hold it.
func (r *Runnable) finish(err error) {
	r.err = err
	if r.metered {
		stats.fold(r)
	}
	close(r.stopped)
}

// Done returns a channel closed when the drain is over: when Start returns, or, on a
// standby (whose Start never runs), when the stop procedure drained.
func (r *Runnable) Done() <-chan struct{} { return r.stopped }

// Err returns the drain's result, once Done is closed: nil when every call returned, or
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
