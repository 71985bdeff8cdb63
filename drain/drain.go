package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/quiesce-dev/quiesce/internal"
)

// Options configure an Executor. The zero value is valid: a zero field means its default.
type Options struct {
	// Logger receives the reports, the slow calls and the panics nobody waits for. The
	// zero value discards. A Logger that panics or blocks crashes and delays nothing.
	Logger logr.Logger

	// MaxConcurrent bounds how many fn run at once; 0 or negative: unbounded. Call, Go and
	// Run wait for a slot, honouring their ctx and the drain. A call nested in a call of the
	// same executor runs in its slot (no deadlock); daemons and webhook calls take none.
	MaxConcurrent int

	// ReportAfter is how long Drain waits before its first report of pending calls.
	// 0 or negative: 1s. At least MinReportAfter.
	ReportAfter time.Duration

	// ReportEvery is the interval between later reports, and the least interval between
	// two reports of slow calls. 0 or negative: 5s. At least MinReportEvery.
	ReportEvery time.Duration

	// CancelAfter is how long after Drain began the contexts of calls still running are
	// cancelled, so that in-flight work can finish first. 0: 4/5 of the time left until
	// the first Drain's ctx deadline (at once without one); CancelAtOnce: as Drain
	// begins, as controller-runtime does; negative: never.
	CancelAfter time.Duration

	// SlowAfter: outside a drain, calls running longer are logged ("Slow calls"). 0: 1m,
	// the API server's default request timeout; negative: never. At least MinSlowAfter.
	// A call is logged within ReportEvery of turning slow; while the set of slow calls
	// stays the same, each line waits twice as long as the one before, from ReportEvery
	// up to an hour (one call stuck an hour: 10 lines). One timer per executor.
	SlowAfter time.Duration

	// Clock schedules the reports, CancelAfter and SlowAfter. nil: clock.RealClock{}.
	Clock clock.WithTickerAndDelayedExecution
}

// CancelAtOnce as Options.CancelAfter cancels the calls as the drain begins. It is the
// least positive duration, so a flag (--quiesce-cancel-after=1ns) can say it too.
const CancelAtOnce = time.Nanosecond

// The least values of Options.ReportAfter, ReportEvery and SlowAfter: New panics on a
// positive value below them (every report captures every goroutine's stack).
const (
	MinReportAfter = 100 * time.Millisecond
	MinReportEvery = 500 * time.Millisecond
	MinSlowAfter   = time.Second
)

// ErrDraining is returned (wrapped) by Call, Go and Run once the executor drains.
var ErrDraining = errors.New("executor is draining")

// ErrInvalidCall is returned (wrapped) by Call, Go and Run for a nil ctx, an empty name or
// a nil fn, and by Call, Go, Run and Drain of an Executor that New did not create.
var ErrInvalidCall = errors.New("invalid call")

// What Where and Handler say of a call whose location is unknown (logged once why), whose
// fn has not begun, or whose fn returned a moment ago.
const (
	Unknown    = "unknown"
	NotStarted = "not started"
	Returning  = "returning"
)

// Pending describes a call that has not returned yet.
type Pending struct {
	Name     string
	Started  time.Time // when the call was admitted
	Detached bool      // its caller stopped waiting; only the executor still tracks it
	Daemon   bool      // a daemon runs until the drain, which cancels it as it begins; never slow
	// ReconcileID is controller-runtime's of the wrapped reconcile the call is or runs in.
	ReconcileID string
	// Where its goroutine is blocked, the innermost frame outside the runtime, the
	// standard library and quiesce ("pkg.Func (file.go:123)"); Handler, the line of the
	// call's own function where it waits. Filled by Locate, reports and PendingError.
	Where, Handler string

	cleanup time.Duration // its cleanup window, once the drain cancelled it; 0 otherwise
}

// PanicError is the error of a call whose fn panicked.
type PanicError struct {
	Name  string
	Value any
	Stack []byte

	logged bool // the executor logged it (repanic); read after the call's done
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("call %q panicked: %s", internal.Cut(e.Name), internal.Cut(fmt.Sprint(e.Value)))
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// PendingError is returned by Drain when its ctx ends first. Pending holds every call
// still running; Error names the first 20, quoted and cut, so no name floods a line.
type PendingError struct {
	Pending []Pending
	Err     error
}

func (e *PendingError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "failed to drain: %v: %d call(s) still running", e.Err, len(e.Pending))
	sep := ": "
	for _, p := range e.Pending[:min(len(e.Pending), internal.MaxListed)] {
		fmt.Fprintf(&b, "%s%q", sep, internal.Cut(p.Name))
		if p.Where != "" {
			fmt.Fprintf(&b, " at %q", internal.Cut(p.Where))
		}
		sep = ", "
	}
	if more := len(e.Pending) - internal.MaxListed; more > 0 {
		fmt.Fprintf(&b, " and %d more", more)
	}
	return b.String()
}

// Unwrap returns the error of Drain's ctx.
func (e *PendingError) Unwrap() error { return e.Err }

// Stats are the executor's counters, for metrics; in every snapshot Finished <= Started.
type Stats struct {
	InFlight  int64  // calls admitted and not yet returned
	Started   uint64 // calls admitted (they run, or are about to)
	Finished  uint64 // calls whose fn returned (including panics)
	Refused   uint64 // calls refused because the executor drains (not bad input)
	Panicked  uint64
	Abandoned uint64 // calls still running when a Drain gave up (its ctx ended)
	Cancelled uint64 // calls (daemons aside) the drain cancelled while they ran

	Oldest time.Time // admission of the oldest pending call, daemons aside; zero if none
	Slow   int64     // pending calls running for SlowAfter or longer, daemons aside
}

// Executor runs named calls on tracked goroutines. Create it with New. All its methods
// are safe for concurrent use. It drains once: then it refuses new calls for good.
type Executor struct {
	opts     Options       // defaults filled in
	slots    chan struct{} // MaxConcurrent tokens; nil when unbounded
	settings internal.Settings

	// mu guards admission and the list (one step: Drain, Pending and Stats agree), the timers.
	mu          sync.Mutex
	calls       call // the root of the admitted calls, a ring in admission order: next is the oldest
	inFlight    int64
	isDraining  bool
	cancelCause error         // once the drain or a fence cancelled all: nested calls start so
	waiters     int           // Drain calls waiting; reports are logged only while one waits
	lineDone    chan struct{} // closed when the last report line begun was logged
	// slow: what the last "Slow calls" line said; the next on the same set is due backoff after.
	slow struct {
		count   int
		newest  *call
		logged  time.Time
		backoff time.Duration
	}
	slowTimer clock.Timer // armed while calls are in flight outside a drain; nil once fired
	report    clock.Timer // the next report, while a Drain waits
	cancelTmr clock.Timer // CancelAfter, until it fired or the calls all returned
	labels    *labelTable // the pprof label ids of its calls (see labels.go); nil once its drain is over

	// cleanupTmrs cancel calls early for their cleanup windows (cleanupAt), as cancelTmr.
	cleanupTmrs []clock.Timer
	plan        cancelPlan // set as the drain begins, under mu; read-only after

	fenced    context.Context         // ended by Fence (internal.Core.Fenced)
	fence     context.CancelCauseFunc // ends fenced
	draining  chan struct{}           // closed when Drain begins
	done      chan struct{}           // closed when draining and nothing is in flight
	drainOnce sync.Once
	hold      *tableHold  // e's hold on labels, until executors takes them back
	logging   atomic.Bool // a report is being logged (see reportDue)
	unknown   sync.Map    // reasons for an unknown location already logged

	started, finished, refused, panicked, abandoned, cancelled atomic.Uint64

	raised    sync.Map    // *call → *PanicError: a nested call's panic raised on its goroutine
	anyRaised atomic.Bool // raised was ever written: finish skips its Delete until then
}

// New returns an Executor configured by opts, zero fields taking their defaults. It panics
// on a positive ReportAfter, ReportEvery or SlowAfter below its Min: found at setup.
func New(opts Options) *Executor {
	atLeast := func(field string, val, least time.Duration) {
		if val > 0 && val < least {
			panic(fmt.Sprintf("drain.New: Options.%s %v is below its least value %v (drain.Min%s): "+
				"every report captures every goroutine's stack", field, val, least, field))
		}
	}
	atLeast("ReportAfter", opts.ReportAfter, MinReportAfter)
	atLeast("ReportEvery", opts.ReportEvery, MinReportEvery)
	atLeast("SlowAfter", opts.SlowAfter, MinSlowAfter)
	if opts.ReportAfter <= 0 {
		opts.ReportAfter = time.Second
	}
	if opts.ReportEvery <= 0 {
		opts.ReportEvery = internal.DefaultReportEvery
	}
	opts.SlowAfter = cmp.Or(opts.SlowAfter, internal.DefaultSlowAfter)
	if internal.IsNil(opts.Clock) {
		opts.Clock = clock.RealClock{}
	}
	if internal.NoLogger(opts.Logger) {
		opts.Logger = logr.Logger{}
	}
	e := &Executor{opts: opts, draining: make(chan struct{}), done: make(chan struct{})}
	e.calls.prev, e.calls.next = &e.calls, &e.calls
	e.fenced, e.fence = context.WithCancelCause(context.Background())
	addExecutor(e)
	if opts.MaxConcurrent > 0 {
		e.slots = make(chan struct{}, opts.MaxConcurrent)
	}
	return e
}

// core is the Executor as internal.Core.
type core Executor

func init() {
	internal.CoreOf = func(ex any) internal.Core {
		if e, _ := ex.(*Executor); e != nil && e.draining != nil {
			return (*core)(e)
		}
		return nil
	}
}

func (c *core) Settings() *internal.Settings { return &c.settings }

func (c *core) Run(ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
	return c.RunHandler(ctx, o, funcHandler(fn))
}

// RunHandler is Run itself, so a wrapped reconcile's stacks hold one quiesce frame fewer.
func (c *core) RunHandler(ctx context.Context, o internal.CallOptions, h internal.Handler) error {
	cl, err := (*Executor)(c).admit(ctx, &o, h)
	if err != nil {
		return err
	}
	cl.onCaller = true
	cl.exec(h)
	return cl.err
}

func (c *core) Call(ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
	return (*Executor)(c).call(ctx, &o, funcHandler(fn), true)
}

func (c *core) Go(ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
	return (*Executor)(c).call(ctx, &o, funcHandler(fn), false)
}

func (c *core) Now() time.Time { return c.opts.Clock.Now() }

func (c *core) Fenced() context.Context { return c.fenced }

func (c *core) Listing(limit int) (internal.Entries, int) { return c.entries(limit, true) }

func (c *core) Entries(limit int) (internal.Entries, int) { return c.entries(limit, false) }

func (c *core) entries(limit int, shared bool) (internal.Entries, int) {
	calls, total := (*Executor)(c).list(limit)
	return entries((*Executor)(c).locate(calls, shared), c.opts.Clock.Now()), total
}

func (c *core) Fence(cause error) int {
	c.mu.Lock()
	c.cancelCause = cause
	c.mu.Unlock()
	c.fence(cause)
	calls, _ := (*Executor)(c).list(-1)
	for _, cl := range calls {
		cl.cancel(cause)
	}
	return len(calls)
}

// Call runs fn on a tracked goroutine and waits until fn returns or ctx ends. If ctx ends
// first, Call returns ctx.Err() and fn runs on, tracked (detached). If ctx is done already,
// Call runs nothing and returns ctx.Err(). Once Drain began, Call runs nothing and returns
// an error wrapping ErrDraining (ctx done or not), unless ctx belongs to a call of this
// executor still running: work admitted before the drain finishes, nested calls included
// (admitted after the drain cancelled the calls, they start cancelled). A nil ctx, an
// empty name or a nil fn give an error wrapping ErrInvalidCall.
//
// fn's context carries ctx's values and deadline and ends when ctx ends, when the drain
// cancels it (context.Cause says so) and when fn returns. fn's goroutine and context carry
// ctx's pprof labels plus "quiesce", by which reports find it. A panic in fn returns a
// *PanicError; runtime.Goexit an error. With MaxConcurrent > 0, Call first waits for a slot.
func (e *Executor) Call(ctx context.Context, name string, fn func(context.Context) error) error {
	return e.call(ctx, &internal.CallOptions{Name: name}, funcHandler(fn), true)
}

// call runs fn on a goroutine of its own and, if wait, waits as Call does; else, as Go.
func (e *Executor) call(ctx context.Context, o *internal.CallOptions, fn internal.Handler, wait bool) error {
	c, err := e.admit(ctx, o, fn)
	if err != nil {
		return err
	}
	if !wait {
		c.state.Store(callDetached)
		go c.exec(fn)
		return nil
	}
	c.done = make(chan struct{})
	go c.exec(fn)
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(callWaiting, callDetached) {
			return ctx.Err()
		}
		<-c.done // fn returned meanwhile; take its result instead
	}
	if o.Repanic && c.panicked {
		pe := c.err.(*PanicError) //nolint:errcheck,forcetypeassert // panicked: err is its *PanicError
		// The panic raised here shows the caller's stack: fn's is logged first, once.
		if !pe.logged {
			pe.logged = true
			e.logPanic(pe)
		}
		c.raising(pe)
		panic(pe.Value)
	}
	return c.err
}

// Go is Call without waiting: nil once fn is tracked, or Call's error without running fn.
// The call is detached from the start; a panic in fn is logged ("Call panicked").
func (e *Executor) Go(ctx context.Context, name string, fn func(context.Context) error) error {
	return e.call(ctx, &internal.CallOptions{Name: name}, funcHandler(fn), false)
}

// Run is Call on the caller's goroutine, for callers that wait anyway (reconcilers.Wrap):
// it waits for fn even when ctx ends first (it never detaches). The goroutine carries the
// labels while fn runs, restored after as pprof.Do does. A panic returns a *PanicError; a
// runtime.Goexit settles the call and goes on exiting.
func (e *Executor) Run(ctx context.Context, name string, fn func(context.Context) error) error {
	return (*core)(e).RunHandler(ctx, internal.CallOptions{Name: name}, funcHandler(fn))
}

// admit checks e and the input, takes a slot and lists the call, unless the drain refuses it.
func (e *Executor) admit(ctx context.Context, o *internal.CallOptions, fn internal.Handler) (*call, error) {
	switch {
	case e.created() != nil:
		return nil, errNotCreated
	case ctx == nil:
		return nil, fmt.Errorf("failed to run call %q: nil context: %w", internal.Cut(o.FullName()), ErrInvalidCall)
	case o.Name == "" && o.Object == "":
		return nil, fmt.Errorf("failed to run call: empty name: %w", ErrInvalidCall)
	case noFunc(fn):
		return nil, fmt.Errorf("failed to run call %q: nil func: %w", internal.Cut(o.FullName()), ErrInvalidCall)
	}
	if err := ctx.Err(); err != nil {
		// A late call of a returned reconcile learns why: ErrDraining.
		e.mu.Lock()
		refused := e.isDraining && !e.inFlightOuter(ctx)
		e.mu.Unlock()
		if refused {
			return nil, e.refuse(o)
		}
		return nil, err
	}
	slot, err := e.acquire(ctx, o)
	if err != nil {
		return nil, err
	}
	c := newCall(ctx, e, o, slot)
	e.mu.Lock()
	if e.isDraining && !e.inFlightOuter(ctx) {
		e.mu.Unlock()
		if slot {
			<-e.slots
		}
		c.cancel(errFinished)
		return nil, e.refuse(o)
	}
	e.link(c)
	var cause error
	if e.isDraining {
		cause = e.cancelCause
	}
	e.mu.Unlock()
	if cause != nil {
		c.cancel(cause) // a nested call admitted after the drain cancelled the calls
	}
	return c, nil
}

// inFlightOuter reports whether ctx belongs to a call of e still listed, whose nested calls
// the drain admits (a handler must not fail half-done). The caller holds e.mu.
func (e *Executor) inFlightOuter(ctx context.Context) bool {
	outer, ok := ctx.Value(internal.CallKey{}).(*call)
	return ok && outer.e == e && outer.prev != nil
}

// link lists c as the newest call, with a label id. The caller holds e.mu.
func (e *Executor) link(c *call) {
	e.started.Add(1)
	e.inFlight++
	e.takeLabel(c)
	if newest := e.calls.prev; newest != &e.calls && c.start.Before(newest.start) {
		// Listed after a call stamped later: the list stays oldest first by Started.
		c.start = newest.start
	}
	c.prev, c.next = e.calls.prev, &e.calls
	c.prev.next, c.next.prev = c, c
	if e.slowTimer == nil && !c.opts.Daemon {
		e.armSlow(e.opts.SlowAfter)
	}
}

// unlink forgets a settled call, taking its label back; the last one of a drain ends it.
func (e *Executor) unlink(c *call) {
	e.mu.Lock()
	c.label.call.Store(nil)
	e.labels.free = append(e.labels.free, c.label)
	c.prev.next, c.next.prev = c.next, c.prev
	c.prev, c.next = nil, nil
	e.inFlight--
	e.unlock()
}

// unlock unlocks e.mu, after ending the drain if it is over: nothing is in flight.
func (e *Executor) unlock() {
	over := e.isDraining && e.inFlight == 0
	if over {
		stopTimer(e.report)
		stopTimer(e.cancelTmr)
		for _, t := range e.cleanupTmrs {
			stopTimer(t)
		}
		e.report, e.cancelTmr, e.cleanupTmrs = nil, nil, nil
		e.labels = nil // they go to the next executor (labels.go)
	}
	e.mu.Unlock()
	if over {
		releaseTable(e.hold)
		close(e.done)
	}
}

func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// acquire takes a MaxConcurrent slot, if the call needs one, giving up when ctx ends or the
// drain begins. Daemons, webhook calls and calls nested in a call of e take none.
func (e *Executor) acquire(ctx context.Context, o *internal.CallOptions) (slot bool, err error) {
	if outer, ok := ctx.Value(internal.CallKey{}).(*call); e.slots == nil || o.Daemon || o.NoSlot || ok && outer.e == e {
		return false, nil
	}
	select {
	case e.slots <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	case <-e.draining:
		return false, e.refuse(o)
	}
}

func (e *Executor) refuse(o *internal.CallOptions) error {
	e.refused.Add(1)
	return fmt.Errorf("failed to run call %q: %w", internal.Cut(o.FullName()), ErrDraining)
}

// Drain refuses new calls, then waits for every tracked call to return. It returns nil
// when all returned, or, when ctx (nil: none) ends first, a *PendingError naming each call
// still running (counted once in Stats.Abandoned; they stay tracked, and a later Drain
// waits again). Drain is idempotent; concurrent Drains all wait.
//
// As it begins, it cancels daemons and CancelAtStop calls; the others at CancelAfter, or
// earlier for a call with a cleanup window (reconcilers.WrapOptions.Cleanup) that CancelAfter
// would not leave before the abandon (the owner's grace period, else ctx's deadline).
// Reports come ReportAfter after it began, then every ReportEvery, while a Drain waits and
// a call is pending. It returns as soon as the last call does, after the line being logged
// (at most 100ms), and leaves no goroutine nor timer behind but a due CancelAfter.
func (e *Executor) Drain(ctx context.Context) error {
	if err := e.created(); err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	e.mu.Lock()
	e.waiters++
	if e.waiters == 1 && e.isDraining && e.inFlight > 0 {
		e.armReport(e.opts.ReportEvery) // a Drain waits again after one gave up
	}
	e.mu.Unlock()
	e.drainOnce.Do(func() { e.beginDrain(ctx) })
	defer e.stopWaiting()
	select {
	case <-e.done:
	case <-ctx.Done():
	}
	if internal.Closed(e.done) { // also when both were ready: the calls did return
		return nil
	}
	calls, _ := e.list(-1)
	for _, c := range calls {
		if c.count(countedAbandoned) {
			e.abandoned.Add(1)
		}
	}
	return &PendingError{Pending: e.locate(calls, false), Err: ctx.Err()}
}

// stopWaiting ends a Drain's wait: the last stops the reports; each waits for a line begun.
func (e *Executor) stopWaiting() {
	e.mu.Lock()
	e.waiters--
	if e.waiters == 0 {
		stopTimer(e.report)
		e.report = nil
	}
	lineDone := e.lineDone
	e.mu.Unlock()
	if lineDone != nil {
		select {
		case <-lineDone:
		case <-time.After(100 * time.Millisecond): // a blocked Logger does not hold the drain up longer
		}
	}
}

// beginDrain runs once, for the first Drain's ctx: under the lock, a refused caller always
// finds Draining() closed, and the timers exist once it is (a test stepping a fake clock
// cannot miss them).
func (e *Executor) beginDrain(ctx context.Context) {
	cancelAfter := e.opts.CancelAfter
	dl, hasDeadline := ctx.Deadline()
	if cancelAfter == 0 {
		cancelAfter = CancelAtOnce // without a deadline; with one, 4/5 of the time left
		if hasDeadline {
			cancelAfter = max(time.Until(dl)/5*4, CancelAtOnce)
		}
	}
	grace := e.settings.Grace
	if grace <= 0 && hasDeadline {
		grace = time.Until(dl)
	}
	e.mu.Lock()
	e.isDraining = true
	e.plan = cancelPlan{after: cancelAfter, grace: grace}
	stopTimer(e.slowTimer)
	var cleanupNow bool
	if e.inFlight > 0 {
		e.armReport(e.opts.ReportAfter)
		if cancelAfter > CancelAtOnce {
			// go: a fake clock calls the func under its lock (a lock-order inversion).
			e.cancelTmr = e.opts.Clock.AfterFunc(cancelAfter, func() { go e.cancelCalls(passAll, 0) })
		}
		armed := map[time.Duration]bool{}
		for c := e.calls.next; c != &e.calls; c = c.next {
			at, early := e.cleanupAt(c)
			switch {
			case !early || armed[at]:
			case at == 0:
				cleanupNow = true
			default:
				armed[at] = true
				e.cleanupTmrs = append(e.cleanupTmrs, e.opts.Clock.AfterFunc(at, func() { go e.cancelCalls(passCleanup, at) }))
			}
		}
	}
	close(e.draining)
	e.unlock()
	if cancelAfter == CancelAtOnce {
		e.cancelCalls(passAll, 0)
	} else {
		e.cancelCalls(passStart, 0)
	}
	if cleanupNow {
		e.cancelCalls(passCleanup, 0)
	}
}

// cleanupDue reports whether c's cleanup window is due by at, the drain's time.
func (e *Executor) cleanupDue(c *call, at time.Duration) bool {
	when, early := e.cleanupAt(c)
	return early && when <= at
}

// cancelPlan is when the drain cancels calls, from its start: fixed as it begins.
type cancelPlan struct {
	after time.Duration // CancelAfter as the drain applies it (CancelAtOnce; negative: never)
	grace time.Duration // the time until the abandon, for cleanup windows; 0: unknown
}

// cleanupAt returns when, from the drain's start, c is cancelled to keep its cleanup window
// (internal.Settings.Cleanups) before the abandon, and whether that comes before CancelAfter.
func (e *Executor) cleanupAt(c *call) (at time.Duration, early bool) {
	p := e.plan
	window := e.settings.CleanupOf(c.opts.Controller)
	if window <= 0 || p.grace <= 0 || p.after == CancelAtOnce {
		return 0, false
	}
	at = max(p.grace-window, 0)
	return at, p.after < 0 || at < p.after
}

// armReport arms the next report in d, a new timer each time (fake clocks' AfterFunc
// timers fire once; they call the func under their lock). The caller holds e.mu.
func (e *Executor) armReport(d time.Duration) {
	stopTimer(e.report)
	e.report = e.opts.Clock.AfterFunc(d, func() { go e.reportDue() })
}

// Passes of cancelCalls.
const (
	passStart   = iota // as the drain begins: daemons and CancelAtStop calls
	passCleanup        // calls whose cleanup window leaves them until then (cleanupAt)
	passAll            // at CancelAfter: all
)

// cancelCalls ends the contexts of the calls that pass (at: the drain's time of a
// passCleanup) ends; those it cuts, daemons aside, are counted in Stats.Cancelled and logged.
func (e *Executor) cancelCalls(pass int, at time.Duration) {
	cause := errCancelledByDrain
	switch pass {
	case passStart:
		cause = internal.ErrCancelAtStop
	case passCleanup:
		cause = errCancelledForCleanup
	default:
		e.mu.Lock()
		if e.cancelCause == nil { // a fence's cause stays
			e.cancelCause = errCancelledByDrain
		}
		e.mu.Unlock()
	}
	// Counted, and the line's wait registered, before any context ends: a cancelled fn may
	// return at once, and the Drain it was the last call of with it.
	calls, _ := e.list(-1)
	var targets, cut []*call
	for _, c := range calls {
		switch {
		case c.opts.Daemon:
			c.cancel(errCancelledByDrain)
		case pass == passAll || pass == passStart && c.opts.CancelAtStop || pass == passCleanup && e.cleanupDue(c, at):
			targets = append(targets, c)
			if c.since.Load() != sinceLeft && c.count(countedCancelled) {
				cut = append(cut, c)
			}
		}
	}
	if len(cut) > 0 {
		e.cancelled.Add(uint64(len(cut)))
		// On a goroutine of its own, as reports are; Drain waits for it (stopWaiting).
		lineDone := make(chan struct{})
		e.mu.Lock()
		e.lineDone = lineDone
		e.mu.Unlock()
		go func() {
			defer close(lineDone)
			listed := pendings(cut[:min(len(cut), internal.MaxListed)])
			kv := e.stopKV("cancelled", len(cut), "cause", cause.Error(), "calls", entries(listed, e.opts.Clock.Now()))
			kv = internal.More(kv, len(cut), len(listed))
			internal.Safely(func() { e.opts.Logger.Info("Cancelling calls still running", kv...) })
		}()
	}
	for _, c := range targets {
		c.cancel(cause)
	}
}

// stopKV returns the key/values a drain's line starts with (Settings.StopKV), then kv.
func (e *Executor) stopKV(kv ...any) []any {
	if f := e.settings.StopKV; f != nil {
		return append(f(), kv...)
	}
	return kv
}

// list returns the oldest limit calls (all if limit < 0) and how many are admitted.
func (e *Executor) list(limit int) (calls []*call, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for c := e.calls.next; c != &e.calls && (limit < 0 || len(calls) < limit); c = c.next {
		calls = append(calls, c)
	}
	return calls, int(e.inFlight)
}

// Pending returns the calls admitted and not yet returned, oldest first, without Where and Handler.
func (e *Executor) Pending() []Pending {
	e.mustBeCreated()
	calls, _ := e.list(-1)
	return pendings(calls)
}

// Locate returns the oldest limit calls (all if limit < 0) with Where and Handler, and how
// many are pending. One capture of every goroutine's stack serves all who ask within a
// second; its cost grows with the goroutines (docs/performance.md).
func (e *Executor) Locate(limit int) (calls []Pending, total int) {
	e.mustBeCreated()
	cs, total := e.list(limit)
	return e.locate(cs, false), total
}

// Draining returns a channel closed when Drain begins.
func (e *Executor) Draining() <-chan struct{} {
	e.mustBeCreated()
	return e.draining
}

// Stats returns the executor's counters.
func (e *Executor) Stats() Stats {
	e.mustBeCreated()
	finished := e.finished.Load() // first: a call is counted started before it can finish
	e.mu.Lock()
	defer e.mu.Unlock()
	var oldest time.Time
	for c := e.calls.next; c != &e.calls && oldest.IsZero(); c = c.next {
		if !c.opts.Daemon {
			oldest = c.start
		}
	}
	_, slow, _, _ := e.slowCalls(e.opts.Clock.Now(), 0)
	return Stats{
		InFlight: e.inFlight, Started: e.started.Load(), Finished: finished, Refused: e.refused.Load(),
		Panicked: e.panicked.Load(), Abandoned: e.abandoned.Load(), Cancelled: e.cancelled.Load(),
		Oldest: oldest, Slow: int64(slow),
	}
}

// FromContext reports whether ctx is, or derives from, a tracked call's fn's context, and
// returns that call's executor and name (the innermost call's).
func FromContext(ctx context.Context) (ex *Executor, name string, ok bool) {
	if ctx != nil {
		if c, ok := ctx.Value(internal.CallKey{}).(*call); ok {
			return c.e, c.name(), true
		}
	}
	return nil, "", false
}

var errNotCreated = fmt.Errorf("%s: %w", internal.NotCreated, ErrInvalidCall)

// created returns an error unless New made e; mustBeCreated panics instead.
func (e *Executor) created() error {
	if e == nil || e.draining == nil {
		return errNotCreated
	}
	return nil
}

func (e *Executor) mustBeCreated() {
	if e.created() != nil {
		panic(internal.NotCreated)
	}
}
