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
// documented default. Add checks Options and returns an error naming the value to change;
// New panics on the same misuse of the fields it reads (see the package documentation,
// "Setup misuse").
type Options struct {
	// Logger receives the drain's reports and the stop's timeline. The zero value, as in
	// every quiesce Options but drain's: controller-runtime's logger (Add: the manager's,
	// mgr.GetLogger(); New: log.Log, which ctrl.SetLogger sets), named "quiesce".
	// logr.Discard() is the zero value too: to discard, pass logr.New(log.NullLogSink{}).
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
	// what is abandoned. 0 (the default, as in drain.Options): 4/5 of the time the drain is
	// given, GracePeriod (20s of the default 25s); > 0: below GracePeriod (Add checks it);
	// drain.CancelAtOnce: as the drain begins, as controller-runtime alone does; negative:
	// never cancelled.
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
	// StopContext (mgr.Start(q.StopContext(ctx))); the Runnable fails to start
	// otherwise. From SIGTERM on, ReadyzCheck fails on every replica, leader and
	// standbys, so that Services stop routing to the pod, while webhooks, controllers
	// (with and without leader election), probes and metrics keep serving; a
	// WebhookServer answers with "Connection: close" so that the API server's keep-alive
	// connections move to another replica. Then the manager stops, and the drain proceeds
	// within GracePeriod. Set it to a few readiness probe periods (see docs/operating.md,
	// "Rolling updates"); terminationGracePeriodSeconds must cover ShutdownDelay +
	// GracefulShutdownTimeout. Negative: Add fails. With no delay, ReadyzCheck never fails:
	// a single replica stays in its Service until its webhooks stop, as without quiesce.
	// A second SIGTERM during the delay still exits at once (ctrl.SetupSignalHandler).
	// It is timed on Options.Clock.
	ShutdownDelay time.Duration

	// ManagerOptions are the Options given to ctrl.NewManager; Add requires them. Add reads:
	// GracefulShutdownTimeout (nil: controller-runtime's default, 30s; negative: no
	// limit) to check GracePeriod against it; LeaderElection, and then the lease observer
	// that ObserveLease installed in LeaderElectionResourceLockInterface (Add fails without
	// it); Metrics, to serve DebugPath only behind the metrics server's FilterProvider
	// (see DebugWithoutFilter); and WebhookServer, which Add connects to the Runnable when
	// it is a WebhookServer.
	ManagerOptions *manager.Options

	// DebugWithoutFilter serves DebugPath on a metrics server that has no FilterProvider
	// (kubebuilder's --metrics-secure=false): anyone who reaches the metrics port then
	// reads the names of the objects in flight and the code lines they wait on, and each
	// request captures every goroutine's stack. false (the default): Add serves DebugPath
	// only behind ManagerOptions.Metrics.FilterProvider (authentication and authorization,
	// as for /metrics), and logs once that it is off otherwise.
	DebugWithoutFilter bool

	// Clock stamps the calls and times the reports, CancelAfter and ShutdownDelay (not
	// GracePeriod, on real time). nil: clock.RealClock{}.
	Clock clock.WithTickerAndDelayedExecution

	flagsBound   bool   // BindFlags bound the durations: errors name their flags
	fromConfig   bool   // set by Config.Apply: errors name the fields by their path in the file
	configPrefix string // that path's prefix, e.g. "quiesce."
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
	metered bool // created by Add: in the metrics until the drain is over
	// eventsBudget bounds how long the Observers (Events) may take over the abandoned
	// calls, so that Start returns before the manager gives up waiting.
	eventsBudget time.Duration
	lease        atomic.Pointer[leaseObserver] // connected by Add, when leader election is on
	// elected is the manager's Elected, set by Add when leader election is on: once it is
	// closed, the lease observer must have seen this replica acquire the lease.
	elected <-chan struct{}

	stop  *stopState  // see stop.go
	debug debugView   // see debug.go
	setup *setupState // made by Setup: see setup.go

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
// to a manager: Add does that, with its readyz check, metrics, debug handler, the lease
// observer and the webhook server; New ignores ManagerOptions and DebugWithoutFilter.
//
// The executor is the Runnable's from its creation: the contexts of the reconciles wrapped
// with reconcilers.Wrap end by its drain (Options.CancelAfter), not by controller-runtime's
// cancellation, so that in-flight work finishes; an executor of drain.New leaves contexts as
// they are. A Runnable of New drains when the context given to its Start ends: it is for
// tests and programs without a manager. Given to mgr.Add, it stops as Add's does (first,
// on every replica), but with leader election on nothing fences its calls when the lease
// is lost: in a manager use Add.
//
// New panics on a negative ShutdownDelay or a CancelAfter not below GracePeriod, which Add
// returns as errors (see the package documentation, "Setup misuse").
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
		opts.CancelAfter = defaultCancelAfter(opts.GracePeriod)
	}
	return opts
}

func newRunnable(opts Options, metered bool) *Runnable {
	var clk clock.WithTickerAndDelayedExecution = clock.RealClock{}
	if !internal.IsNil(opts.Clock) {
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
		ex:           ex,
		log:          opts.Logger,
		clock:        clk,
		grace:        opts.GracePeriod,
		metered:      metered,
		eventsBudget: maxEventsBudget,
		stop: &stopState{
			delay:     opts.ShutdownDelay,
			delayName: opts.name("ShutdownDelay"),
			stopping:  make(chan struct{}),
		},
		stopped: make(chan struct{}),
	}
	internal.Of(ex).Settings().StopKV = r.sinceStop // before the executor is shared
	internal.Of(ex).Settings().DrainOver = func() <-chan struct{} {
		if !r.drainStarted.Load() { // set before the drain refuses anything: see startDrain
			return nil
		}
		return r.stopped
	}
	return r
}

// core returns the executor's internal.Core.
func (r *Runnable) core() internal.Core { return internal.Of(r.ex) }

// Add creates a Runnable as New does and adds it to mgr, with ReadyzCheck as the readyz
// check "quiesce", the executor's metrics in controller-runtime's metrics.Registry, and the
// Runnable itself (ServeHTTP) at DebugPath on the manager's metrics server, behind its
// FilterProvider like /metrics (see Options.DebugWithoutFilter). It connects what
// Options.ManagerOptions hold: the lease observer of ObserveLease (required when leader
// election is on) and a WebhookServer.
//
// The Runnable needs no leader election: it runs on every replica, leader and standbys,
// and controller-runtime stops it first, with the other runnables that need none, and
// waits for it before it stops the leader-election group (pkg/manager/internal.go,
// engageStopProcedure, v0.22 through v0.25): the drain begins as the manager's stop
// begins, for every controller.
//
// It must be called before mgr.Start, once per manager. It checks opts first, and returns
// an error naming the value to change when ManagerOptions is nil, when leader election is
// on but ObserveLease was not called, when ShutdownDelay is negative, when CancelAfter > 0
// is not below GracePeriod, when GracePeriod is not below the manager's
// GracefulShutdownTimeout, or on a second Add on one manager. Add is atomic: it makes the
// registrations that can fail first, and an Add that fails leaves mgr as it was (a
// corrected Add works, and so does mgr.Start without quiesce). When DebugPath is not
// served, it logs once why, at V(1). It decides from ManagerOptions, which it trusts to be
// the Options the manager was made from; Setup and Runnable.Add decide from the metrics
// server the manager really made.
//
// The metrics hold the executor until the drain is over, then keep only its counters.
func Add(mgr manager.Manager, opts Options) (*Runnable, error) {
	if mgr == nil {
		return nil, errors.New("failed to add quiesce runnable: nil manager")
	}
	if err := validate(opts); err != nil {
		return nil, fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	mo := opts.ManagerOptions
	ws, _ := mo.WebhookServer.(*webhookServer) // a typed nil is nil: see WebhookServer
	var lease *leaseObserver
	if mo.LeaderElection {
		lease = mo.LeaderElectionResourceLockInterface.(*leaseObserver) // validate checked it
	}
	if internal.NoLogger(opts.Logger) {
		opts.Logger = mgr.GetLogger().WithName("quiesce")
	}
	if err := register(); err != nil {
		return nil, err
	}
	opts = withDefaults(opts)
	r := newRunnable(opts, true)
	r.eventsBudget = eventsBudget(opts.GracePeriod, mo)
	if err := r.attach(mgr, ws, lease, r.debugServed(opts)); err != nil {
		return nil, err
	}
	return r, nil
}

// attach adds r to mgr with its webhook server, lease observer (either may be nil),
// readyz check and, if serveDebug, DebugPath: the part of Add and Runnable.Add that
// touches the manager. Every step that can fail comes first, each undone if a later one
// fails; from the readyz check on, nothing fails on a manager that has not started.
func (r *Runnable) attach(mgr manager.Manager, ws *webhookServer, lease *leaseObserver, serveDebug bool) error {
	if !added.claim(mgr) {
		return errors.New("failed to add quiesce runnable: " +
			"this manager has one already (add quiesce once per manager)")
	}
	if ws != nil && !ws.connect(r) {
		added.release(mgr)
		return errors.New("failed to add quiesce runnable: " +
			"its WebhookServer is connected to another Runnable already (use one WebhookServer per manager)")
	}
	if lease != nil {
		r.elected = mgr.Elected()
	}
	if lease != nil && !lease.connect(r) {
		ws.disconnect(r)
		added.release(mgr)
		return errors.New("failed to add quiesce runnable: the lease observer of its ManagerOptions " +
			"is connected to another Runnable already (call ObserveLease on each manager's own Options)")
	}
	undo := func() {
		lease.disconnect(r)
		ws.disconnect(r)
		added.release(mgr)
	}
	if serveDebug {
		if err := mgr.AddMetricsServerExtraHandler(DebugPath, r); err != nil {
			undo()
			return fmt.Errorf("failed to add quiesce debug handler at %s: %w", DebugPath, err)
		}
	}
	if err := mgr.AddReadyzCheck("quiesce", r.ReadyzCheck); err != nil {
		undo()
		return fmt.Errorf("failed to add quiesce readyz check: %w", err)
	}
	// Tracked before mgr.Add, which may start r at once: a drain over before it was
	// tracked would leave it tracked for good.
	stats.track(r)
	if err := mgr.Add(r); err != nil {
		stats.fold(r)
		undo()
		return fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if lease != nil {
		r.lease.Store(lease)
		// The elector's Events ("became leader"), as controller-runtime records them.
		rec := mgr.GetEventRecorderFor(lease.Identity())
		lease.events.to.Store(&rec)
	}
	return nil
}

// debugServed reports whether Add serves DebugPath, and logs once why not.
func (r *Runnable) debugServed(opts Options) bool {
	m := opts.ManagerOptions.Metrics
	switch {
	case m.BindAddress == "0": // the user's choice: said at V(1) only
		r.log.V(1).Info("Not serving /debug/quiesce: the manager's metrics server is off", "path", DebugPath,
			"howToServe", "set Metrics.BindAddress in the manager's Options, "+
				"or serve the Runnable (an http.Handler) on a server of your own")
		return false
	case m.FilterProvider == nil && !opts.DebugWithoutFilter:
		r.log.V(1).Info("Not serving /debug/quiesce: the metrics server authenticates no one", "path", DebugPath,
			"howToServe", "set Metrics.FilterProvider (kubebuilder: --metrics-secure), "+
				"or Options.DebugWithoutFilter to serve it to anyone who reaches the metrics port")
		return false
	}
	return true
}

// maxEventsBudget bounds how long the Observers (WrapOptions.Recorder's Events) may take over
// the abandoned calls: they read each object from the API server.
const maxEventsBudget = 5 * time.Second

// eventsBudget is how long the Observers may take over the abandoned calls: half the time
// between the end of the grace period and the manager's GracefulShutdownTimeout, at most
// maxEventsBudget, so that Start returns before the manager gives up waiting.
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

// defaultGracefulShutdownTimeout is controller-runtime's default GracefulShutdownTimeout.
const defaultGracefulShutdownTimeout = 30 * time.Second

// checkDurations checks the durations of opts, which New and Add are given, before their
// defaults are filled in, and says which value to change.
func checkDurations(opts Options) error {
	grace := opts.GracePeriod
	if grace <= 0 {
		grace = DefaultGracePeriod
	}
	delay, cancelAfter, gracePeriod := opts.name("ShutdownDelay"), opts.name("CancelAfter"), opts.name("GracePeriod")
	if opts.ShutdownDelay < 0 {
		return fmt.Errorf("%s is %v: set it to 0 (no delay) or more", delay, opts.ShutdownDelay)
	}
	if opts.CancelAfter > 0 && opts.CancelAfter >= grace {
		return fmt.Errorf("%s (%v) must be below %s (%v): lower %s, or raise %s",
			cancelAfter, opts.CancelAfter, gracePeriod, grace, cancelAfter, gracePeriod)
	}
	return nil
}

// validate checks the options Add is given, before their defaults are filled in, and says
// which value to change.
func validate(opts Options) error {
	mo := opts.ManagerOptions
	if mo == nil {
		return errors.New("Options.ManagerOptions is nil: set it to the ctrl.Options given to ctrl.NewManager " +
			"(quiesce reads their GracefulShutdownTimeout, leader election, metrics server and webhook server)")
	}
	if _, ok := mo.LeaderElectionResourceLockInterface.(*leaseObserver); mo.LeaderElection && !ok {
		return errors.New("leader election is on, but quiesce does not observe the lease: " +
			"call runnable.ObserveLease(cfg, &mgrOpts) before ctrl.NewManager(cfg, mgrOpts)")
	}
	return checkTimeouts(opts)
}

// checkTimeouts checks the durations of opts, and GracePeriod against the
// GracefulShutdownTimeout of opts.ManagerOptions (not nil).
func checkTimeouts(opts Options) error {
	mo := opts.ManagerOptions
	if err := checkDurations(opts); err != nil {
		return err
	}
	grace := opts.GracePeriod
	if grace <= 0 {
		grace = DefaultGracePeriod
	}
	gracePeriod := opts.name("GracePeriod")
	timeout, source := defaultGracefulShutdownTimeout, "controller-runtime's default, as ManagerOptions set none"
	if mo.GracefulShutdownTimeout != nil {
		timeout, source = *mo.GracefulShutdownTimeout, "from ManagerOptions"
	}
	if timeout < 0 { // the manager waits for its runnables as long as they take
		return nil
	}
	if grace >= timeout {
		return fmt.Errorf("%s (%v) must be below the manager's GracefulShutdownTimeout (%v, %s): "+
			"raise GracefulShutdownTimeout in the manager's Options above %v, or lower %s",
			gracePeriod, grace, timeout, source, grace, gracePeriod)
	}
	return nil
}

// Executor returns the executor the Runnable owns and drains. Pass it to reconcilers.Wrap.
func (r *Runnable) Executor() *drain.Executor { return r.ex }

// NeedLeaderElection is false: the Runnable runs on every replica, leader and standbys, and
// controller-runtime stops it first, before the leader-election group (see Add). Fencing,
// when the lease is lost, comes from the lease itself (ObserveLease), not from the group
// the Runnable runs in.
func (r *Runnable) NeedLeaderElection() bool { return false }

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

// Start blocks until ctx ends, then drains, and returns the drain's result. It returns
// nil when every call returned. Otherwise it logs the calls it abandoned as one error line
// (the oldest 20, and how many more) and returns an error that counts them, points at the
// log, and wraps the *drain.PendingError listing them all (errors.As), itself wrapping
// context.DeadlineExceeded.
//
// The drain is the stop procedure, one step at a time: the stop begins (at the end of
// ShutdownDelay, StopContext logged its start); the executor refuses new calls and waits up
// to GracePeriod for the tracked ones (reconciles of both groups, their calls, daemons and
// webhook calls), while it logs what it still waits for; then the leader-election group,
// the caches and the webhooks stop. A lost lease (ObserveLease) starts the drain early,
// with every call's context ended. A Runnable starts once: a second Start returns an error
// at once, and so does a Start with a ShutdownDelay when the manager's context did not come
// from StopContext.
func (r *Runnable) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("failed to start quiesce runnable: already started")
	}
	if r.stop.delay > 0 && !r.stop.delayed.Load() {
		return fmt.Errorf("failed to start quiesce runnable: %s is %v, "+
			"but the manager's context does not come from StopContext: start the manager with "+
			"mgr.Start(q.StopContext(ctx)), or set no %s", r.stop.delayName, r.stop.delay, r.stop.delayName)
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
	select {
	case <-r.elected: // nil without leader election: never
		r.checkLeaseObserved()
		<-ctx.Done()
	case <-ctx.Done():
	}

	// Step 1: the stop began.
	r.beginStop()

	// Step 2: drain every tracked call of this replica, leader or standby, within
	// GracePeriod. The leader-election group, the caches and the webhooks stop after this
	// returns.
	r.startDrain()
	<-r.stopped
	return r.err
}

// checkLeaseObserved logs an error when the manager leads but the lease observer never saw
// this replica acquire the lease: the manager's elector uses a lock of its own, made by
// ctrl.NewManager before ObserveLease ran, and nothing fences when the lease is lost.
func (r *Runnable) checkLeaseObserved() {
	if l := r.lease.Load(); l != nil && !l.used() {
		safely(func() {
			r.log.Error(errLeaseNotObserved,
				"Leader election does not use the lock of ObserveLease: calls are not fenced on a lost lease",
				"fix", "call runnable.ObserveLease(cfg, &mgrOpts) before ctrl.NewManager(cfg, mgrOpts), with the same mgrOpts")
		})
	}
}

// errLeaseNotObserved is the error of the line checkLeaseObserved logs.
var errLeaseNotObserved = errors.New(
	"the manager acquired the lease through another lock than the one ObserveLease installed")

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
	// on each abandoned reconcile's object), before Start and so mgr.Start return; they read
	// from the API server, so within a budget that leaves the manager time to return.
	ectx, ecancel := context.WithTimeout(context.Background(), r.eventsBudget)
	defer ecancel()
	r.core().Abandoned(ectx)
	return err
}

// AbandonedMessage is the message of the error line in which the Runnable names the calls it
// abandoned at the end of the grace period: alert on it, or find it in a test's output
// (shutdowntest reads it).
const AbandonedMessage = "Abandoned calls still running after the grace period"

// abandon logs the calls of pe, bounded like the executor's reports, and returns the error
// for Start. The list appears once in the log, on this line, in the reports' format; the
// error only counts the calls (controller-runtime and main log it again), and the complete
// list stays in the *drain.PendingError it wraps, for code.
func (r *Runnable) abandon(log logr.Logger, pe *drain.PendingError) error {
	calls, _ := r.core().Entries(internal.MaxListed)
	kv := append(r.sinceStop(), "abandoned", len(pe.Pending), "calls", calls)
	if more := len(pe.Pending) - len(calls); more > 0 {
		kv = append(kv, "more", more)
	}
	log.Error(pe.Err, AbandonedMessage, kv...)
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

// Done returns a channel closed when the drain is over, as Start returns.
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
