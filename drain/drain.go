package drain

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/quiesce-dev/quiesce/internal"
)

// Options configure an Executor. The zero value is valid: every zero field means the
// documented default.
type Options struct {
	// Logger receives the reports of pending and slow calls, and the panics of calls
	// started with Go. The zero value discards everything: drain knows nothing of
	// controller-runtime, whose logger is the zero value's in every other quiesce Options
	// (runnable gives the executors it makes its own). A Logger that panics or blocks
	// never crashes the process nor delays the drain: reports are logged on a goroutine
	// of their own, one at a time.
	Logger logr.Logger

	// MaxConcurrent bounds how many fn run at once. 0 or negative: unbounded.
	// When > 0, Call, Go and Run wait for a free slot, honouring their ctx and the drain.
	// A call made inside a tracked call of the same executor (its fn's context, or one
	// derived from it) runs in that call's slot instead of waiting for one of its own, so
	// that nested calls cannot deadlock. Daemons and webhook calls (reconcilers.Daemons,
	// runnable.WebhookServer) never take a slot: MaxConcurrent bounds reconciles and
	// their calls.
	MaxConcurrent int

	// ReportAfter is how long Drain waits before its first report of pending calls.
	// 0 or negative: 1s. At least MinReportAfter.
	ReportAfter time.Duration

	// ReportEvery is the interval between later reports, and the least interval between
	// two reports of slow calls. 0 or negative: 5s. At least MinReportEvery.
	ReportEvery time.Duration

	// CancelAfter is how long after Drain began the contexts of calls still running are
	// cancelled, so that in-flight work can finish first. 0 (the default, as in
	// runnable.Options): 4/5 of the time the drain is given, here the time left until the
	// deadline of the first Drain's ctx (at once when it has none: nothing bounds the
	// drain, and a call waiting for its context would hold it forever); > 0: after that
	// long; CancelAtOnce: as Drain begins, as controller-runtime alone does; negative:
	// never.
	CancelAfter time.Duration

	// SlowAfter: while the executor is not draining, calls running longer than this are
	// logged as slow ("Slow calls"), nothing while none is. 0: 1 minute, the API server's
	// default request timeout: a call running longer is not waiting on a healthy API
	// server, and a reconcile that long holds one of the controller's workers. Negative:
	// never. At least MinSlowAfter. It costs nothing per call: one timer per executor, armed while calls run.
	//
	// The schedule: a call is logged within ReportEvery of turning slow. While the set of
	// slow calls stays the same, the next line waits twice as long as the one before,
	// from ReportEvery up to an hour: for one call stuck an hour with the defaults, lines
	// at 1m, 1m5s, 1m15s, 1m35s, 2m15s, 3m35s, 6m15s, 11m35s, 22m15s and 43m35s (10),
	// then one an hour. A call turning slow, or one returning, changes the set and logs
	// again within ReportEvery. Only a line captures stacks.
	SlowAfter time.Duration

	// Clock schedules the reports, CancelAfter and SlowAfter, and stamps calls' start
	// times. nil: clock.RealClock{}.
	Clock clock.WithTickerAndDelayedExecution
}

// CancelAtOnce as Options.CancelAfter (drain's and runnable's) cancels the contexts of the
// calls still running as the drain begins, on any Clock: controller-runtime's own behaviour.
// It is the least positive duration, so a flag (--quiesce-cancel-after=1ns) can say it too.
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

// Unknown is what Where and Handler say when a call's location cannot be determined; the
// executor logs once why.
const Unknown = "unknown"

// NotStarted is what Where and Handler say for a call admitted whose fn has not begun.
const NotStarted = "not started"

// Returning is what Where and Handler say for a call whose fn has returned a moment ago and
// that the executor is about to unlist: it waits nowhere any more.
const Returning = "returning"

// Pending describes a call that has not returned yet.
type Pending struct {
	Name     string
	Started  time.Time // when the call was admitted
	Detached bool      // its caller stopped waiting; only the executor still tracks it
	// Daemon: the call runs until the drain stops it (reconcilers' per-object daemons).
	// It is never counted nor logged as slow, and the drain cancels it as it begins.
	Daemon bool
	// ReconcileID is controller-runtime's reconcileID of the wrapped reconcile that the
	// call is, or runs inside (reconcilers.Wrap, reconcilers.Call); "" otherwise.
	ReconcileID string
	// Where its goroutine is blocked: the innermost frame outside the Go runtime, the
	// standard library and quiesce, as "pkg.Func (file.go:123)". Filled by Locate,
	// reports and PendingError; Pending leaves it empty.
	Where string
	// Handler is the line in the call's own function (the fn given to Call, Go or Run,
	// or the reconciler given to reconcilers.Wrap; never quiesce's adapters) where it
	// waits. Filled like Where.
	Handler string
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

// Unwrap returns the panic value when it is an error, so that errors.Is and errors.As
// see through a panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// PendingError is returned by Drain when its ctx ends before every call returned.
// Pending holds every call still running; Error names only the first internal.MaxListed, each name
// quoted and cut to 256 bytes, so that no name can forge or flood a line.
type PendingError struct {
	Pending []Pending
	Err     error
}

func (e *PendingError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "failed to drain: %v: %d call(s) still running", e.Err, len(e.Pending))
	for i, p := range e.Pending {
		if i == internal.MaxListed {
			fmt.Fprintf(&b, " and %d more", len(e.Pending)-internal.MaxListed)
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(internal.Cut(p.Name)))
		if p.Where != "" {
			b.WriteString(" at ")
			b.WriteString(strconv.Quote(internal.Cut(p.Where)))
		}
	}
	return b.String()
}

// Unwrap returns the error of Drain's ctx.
func (e *PendingError) Unwrap() error { return e.Err }

// Stats are the executor's counters, for metrics (drain stays free of Prometheus).
// In every snapshot Finished <= Started and InFlight counts only admitted calls.
type Stats struct {
	InFlight  int64  // calls admitted and not yet returned
	Started   uint64 // calls admitted (they run, or are about to)
	Finished  uint64 // calls whose fn returned (including panics)
	Refused   uint64 // calls refused because the executor drains (not bad input)
	Panicked  uint64
	Abandoned uint64 // calls still running when a Drain gave up (its ctx ended)
	// Cancelled counts the calls (daemons aside) whose context the drain cancelled while
	// they ran: at CancelAfter, or as it began for a controller's reconcilers.CancelAtStop.
	Cancelled uint64

	// Oldest is when the oldest pending call was admitted; zero while none is pending.
	// Daemons are left out, here and in Slow: they run until the drain by design.
	Oldest time.Time
	// Slow counts the pending calls that have run for SlowAfter or longer (0 when it is
	// off), as the "Slow calls" line would list them now.
	Slow int64
}

// Defaults of Options (documented there).
const (
	defaultReportAfter = time.Second
	defaultReportEvery = 5 * time.Second
	defaultSlowAfter   = time.Minute
)

// Executor runs named calls on tracked goroutines. Create it with New: Call, Go, Run and
// Drain of an Executor New did not create (a zero one) return an error wrapping
// ErrInvalidCall, saying so; its other methods panic, saying so. All its methods are
// safe for concurrent use. An Executor drains once: after Drain began it refuses every call
// for the rest of its life.
type Executor struct {
	opts     Options
	clock    clock.WithTickerAndDelayedExecution
	log      logr.Logger
	slots    chan struct{} // MaxConcurrent tokens; nil when unbounded
	settings internal.Settings

	// mu guards admission and the list of admitted calls: a call is admitted, listed and
	// counted in one step, so that Drain, Pending and the counters always agree. It also
	// guards the timers and the state of the reports.
	mu         sync.Mutex
	oldest     *call // the admitted calls, a list in admission order, oldest first
	newest     *call
	inFlight   int64
	isDraining bool
	// cancelCause is the cause with which the drain cancelled every call (CancelAfter, a
	// fence), once it did: a nested call admitted later starts cancelled with it.
	cancelCause error
	waiters     int           // Drain calls waiting; reports are logged only while one waits
	lineDone    chan struct{} // closed when the last report line begun was logged
	slow        slowState     // see report.go
	slowTimer   clock.Timer   // armed while calls are in flight outside a drain
	slowArmed   bool
	report      clock.Timer // the next report, while a Drain waits
	cancelTmr   clock.Timer // CancelAfter, until it fired or the calls all returned
	labels      *labelTable // the pprof label ids of its calls (see labels.go); nil once its drain is over

	fenced    context.Context         // ended by Fence (internal.Core.Fenced)
	fence     context.CancelCauseFunc // ends fenced
	draining  chan struct{}           // closed when Drain begins
	done      chan struct{}           // closed when draining and nothing is in flight
	drainOnce sync.Once
	hold      *tableHold    // e's hold on labels, until the registry takes them back
	logging   atomic.Bool   // a report is being logged (see logAsync)
	unknown   atomic.Uint32 // reasons for an unknown location already logged (bits)

	started, finished, refused, panicked, abandoned, cancelled atomic.Uint64

	// raised holds the panics of nested calls raised again with their value on the
	// goroutine of an outer call (see repanic), until that call settles; raisedN counts
	// them, so that a call checks it with one atomic load.
	raisedMu sync.Mutex
	raised   map[*call]*PanicError
	raisedN  atomic.Int32
}

// New returns an Executor configured by opts; zero fields of opts take their defaults.
// It panics on a positive ReportAfter, ReportEvery or SlowAfter below MinReportAfter,
// MinReportEvery or MinSlowAfter: a programming error, found at setup.
func New(opts Options) *Executor {
	for _, b := range []struct {
		field    string
		val, min time.Duration
	}{
		{"ReportAfter", opts.ReportAfter, MinReportAfter},
		{"ReportEvery", opts.ReportEvery, MinReportEvery},
		{"SlowAfter", opts.SlowAfter, MinSlowAfter},
	} {
		if b.val > 0 && b.val < b.min {
			panic(fmt.Sprintf("drain.New: Options.%s %v is below its least value %v (drain.Min%s): "+
				"every report captures every goroutine's stack", b.field, b.val, b.min, b.field))
		}
	}
	if opts.ReportAfter <= 0 {
		opts.ReportAfter = defaultReportAfter
	}
	if opts.ReportEvery <= 0 {
		opts.ReportEvery = defaultReportEvery
	}
	if opts.SlowAfter == 0 {
		opts.SlowAfter = defaultSlowAfter
	}
	if opts.MaxConcurrent < 0 {
		opts.MaxConcurrent = 0
	}
	if internal.IsNil(opts.Clock) {
		opts.Clock = clock.RealClock{}
	}
	if internal.NoLogger(opts.Logger) {
		opts.Logger = logr.Logger{}
	}
	e := &Executor{
		opts:     opts,
		clock:    opts.Clock,
		log:      opts.Logger,
		draining: make(chan struct{}),
		done:     make(chan struct{}),
	}
	e.fenced, e.fence = context.WithCancelCause(context.Background())
	executors.add(e)
	if opts.MaxConcurrent > 0 {
		e.slots = make(chan struct{}, opts.MaxConcurrent)
	}
	return e
}

// core is the Executor as internal.Core: the calls shaped by internal.CallOptions that
// reconcilers and runnable start.
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

// RunHandler is Run's implementation (Executor.Run calls it too), not a step on the way to
// it: a wrapped reconcile (reconcilers.Wrap) calls it, so every stack taken inside the
// reconcile (a panic's, an error's) holds one quiesce frame fewer.
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
	return (*Executor)(c).call(ctx, &o, funcHandler(fn))
}

func (c *core) Go(ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
	return (*Executor)(c).goCall(ctx, &o, funcHandler(fn))
}

func (c *core) Now() time.Time { return c.clock.Now() }

func (c *core) Fenced() context.Context { return c.fenced }

func (c *core) Entries(limit int) (internal.Entries, int) {
	calls, total := (*Executor)(c).Locate(limit)
	return entries(calls, c.clock.Now()), total
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

// Call runs fn on a tracked goroutine and waits until fn returns or ctx ends.
// If ctx ends first, Call returns ctx.Err() at once, and fn keeps running, still tracked:
// Drain waits for it and reports it as detached. If ctx is already done, Call returns
// ctx.Err() without running fn. After Drain began, Call runs nothing and returns an error
// for which errors.Is(err, ErrDraining) holds, unless ctx belongs to a call of this
// executor still running (its fn's context, or one derived from it): work admitted before
// the drain finishes, so its nested calls (Call, Go, Run) are admitted and waited for; one
// admitted after the drain cancelled the calls starts cancelled. A call whose ctx is done
// is refused the same way once draining (ErrDraining, not ctx.Err()). A nil ctx, an empty name
// or a nil fn give an error wrapping ErrInvalidCall.
//
// fn's context carries ctx's values and deadline, ends when ctx ends, when the drain
// cancels it (see Options.CancelAfter; context.Cause then says so), and when fn returns.
// fn's goroutine and context carry ctx's pprof labels plus the label "quiesce", by which
// reports find it. A panic in fn never crashes the process: Call returns a *PanicError
// with the value and stack. If fn calls runtime.Goexit, Call returns an error.
//
// With MaxConcurrent > 0, Call first waits for a free slot; while it waits, ctx ending
// returns ctx.Err() and the drain beginning refuses the call.
func (e *Executor) Call(ctx context.Context, name string, fn func(context.Context) error) error {
	if err := e.created(); err != nil {
		return err
	}
	return e.call(ctx, &internal.CallOptions{Name: name}, funcHandler(fn))
}

func (e *Executor) call(ctx context.Context, o *internal.CallOptions, fn internal.Handler) error {
	c, err := e.admit(ctx, o, fn)
	if err != nil {
		return err
	}
	c.done = make(chan struct{})
	go c.exec(fn)
	if ctxDone := ctx.Done(); ctxDone == nil { // ctx never ends: wait for fn alone
		<-c.done
	} else {
		select {
		case <-c.done:
		case <-ctxDone:
			if c.state.CompareAndSwap(callWaiting, callDetached) {
				return ctx.Err()
			}
			<-c.done // fn returned meanwhile; take its result instead
		}
	}
	if o.Repanic && c.panicked {
		repanic(ctx, c.e, c.err.(*PanicError)) //nolint:errcheck,forcetypeassert // panicked: err is its *PanicError
	}
	return c.err
}

// repanic raises fn's panic again on the caller's goroutine, settled and counted, with the
// value fn panicked with, as if the caller had called fn itself: whoever recovers it
// (controller-runtime's RecoverPanic) sees that value, as without quiesce. fn ran on a
// goroutine of its own, so the stack of the panic raised here shows the caller, not where
// fn panicked: e logs fn's stack first ("Call panicked"), once however deep the calls nest.
// If the caller is itself a tracked call, it is told, so that the panic, reaching it, is
// counted once and keeps fn's stack in its *PanicError.
func repanic(ctx context.Context, e *Executor, pe *PanicError) {
	if !pe.logged {
		pe.logged = true
		e.logPanic(pe)
	}
	if outer, ok := ctx.Value(internal.CallKey{}).(*call); ok {
		outer.e.markRaised(outer, pe)
	}
	panic(pe.Value)
}

// Go is Call without waiting: it returns nil once fn is tracked, or the error that Call
// would return without running fn. With MaxConcurrent > 0 it first waits for a slot like
// Call. Nobody waits for fn's result: Pending reports the call as detached, and a panic
// in fn is logged (message "Call panicked") and counted.
func (e *Executor) Go(ctx context.Context, name string, fn func(context.Context) error) error {
	if err := e.created(); err != nil {
		return err
	}
	return e.goCall(ctx, &internal.CallOptions{Name: name}, funcHandler(fn))
}

func (e *Executor) goCall(ctx context.Context, o *internal.CallOptions, fn internal.Handler) error {
	c, err := e.admit(ctx, o, fn)
	if err != nil {
		return err
	}
	c.state.Store(callDetached)
	go c.exec(fn)
	return nil
}

// Run runs fn as a tracked call on the caller's goroutine and returns fn's result. It is
// Call without the hand-off to a goroutine, for callers that wait for fn anyway
// (reconcilers.Wrap: controller-runtime's worker waits for its reconcile).
//
// Run blocks until fn returns, even when ctx ends first: then fn's context ends, and Run
// still waits for fn and returns its result (it never detaches). Everything else is as
// for Call: admission, refusal, bad input, MaxConcurrent, fn's context. While fn runs,
// the caller's goroutine carries ctx's pprof labels plus "quiesce"; Run then restores the
// labels of ctx, as pprof.Do does. A panic in fn is recovered: Run returns a *PanicError.
// If fn calls runtime.Goexit, the call is settled and the caller's goroutine exits, as it
// would calling fn directly.
func (e *Executor) Run(ctx context.Context, name string, fn func(context.Context) error) error {
	if err := e.created(); err != nil {
		return err
	}
	return (*core)(e).RunHandler(ctx, internal.CallOptions{Name: name}, funcHandler(fn))
}

// admit checks the input, waits for a MaxConcurrent slot, and lists the call unless the
// executor drains and the call is not nested in one still running (see inFlightOuter).
func (e *Executor) admit(ctx context.Context, o *internal.CallOptions, fn internal.Handler) (*call, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("failed to run call %q: nil context: %w", internal.Cut(o.FullName()), ErrInvalidCall)
	case o.Name == "" && o.Object == "":
		return nil, fmt.Errorf("failed to run call: empty name: %w", ErrInvalidCall)
	case noFunc(fn):
		return nil, fmt.Errorf("failed to run call %q: nil func: %w", internal.Cut(o.FullName()), ErrInvalidCall)
	}
	if err := ctx.Err(); err != nil {
		// Once draining, a call not nested in one in flight is refused, its ctx ended or
		// not: a goroutine that outlived its reconcile learns why (ErrDraining).
		e.mu.Lock()
		refused := e.isDraining && !e.inFlightOuter(ctx)
		e.mu.Unlock()
		if refused {
			return nil, e.refuse(o)
		}
		return nil, err
	}
	slot := e.needsSlot(ctx, o)
	if slot {
		if err := e.acquire(ctx, o); err != nil {
			return nil, err
		}
	}
	c := newCall(ctx, e, o)
	c.slot = slot
	// Stamped before the lock, so that reading the clock does not lengthen the executor's
	// lock held by every call; link keeps the list ordered by the stamps.
	c.start = e.clock.Now()
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

// inFlightOuter reports whether ctx belongs to a call of e that is still listed: a call
// nested in work admitted before the drain began, which the drain admits, as it waits for
// that work to finish (a reconcile's handler Call must not fail it half-done). A call whose
// outer call returned (a goroutine outliving its reconcile) is new work: refused. While the
// outer call is listed the drain cannot be over, so admitting its nested calls never
// reopens a finished drain. The caller holds e.mu.
func (e *Executor) inFlightOuter(ctx context.Context) bool {
	outer, ok := ctx.Value(internal.CallKey{}).(*call)
	return ok && outer.e == e && (outer.prev != nil || e.oldest == outer)
}

// link lists c as the newest call, with a label id. The caller holds e.mu.
func (e *Executor) link(c *call) {
	e.started.Add(1)
	e.inFlight++
	e.takeLabel(c)
	if e.newest != nil && c.start.Before(e.newest.start) {
		// Stamped before a call that took the lock first: listed after it, it takes its
		// time, so that the list stays oldest first by Started, exactly.
		c.start = e.newest.start
	}
	c.prev = e.newest
	if e.newest != nil {
		e.newest.next = c
	} else {
		e.oldest = c
	}
	e.newest = c
	if !e.slowArmed && !c.opts.Daemon {
		e.armSlow(e.opts.SlowAfter)
	}
}

// unlink forgets a settled call and takes its label back; the last one to leave a draining
// executor ends the drain.
func (e *Executor) unlink(c *call) {
	e.mu.Lock()
	e.giveLabel(c)
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		e.oldest = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		e.newest = c.prev
	}
	c.prev, c.next = nil, nil
	e.inFlight--
	last := e.inFlight == 0 && e.isDraining
	if last {
		// Nothing left to report on nor to cancel: the timers go with the calls.
		stopTimer(e.report)
		stopTimer(e.cancelTmr)
		e.report, e.cancelTmr = nil, nil
		e.labels = nil // no call holds a label: they go to the next executor (see labels.go)
	}
	e.mu.Unlock()
	if last {
		executors.release(e.hold)
		close(e.done)
	}
}

func stopTimer(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// needsSlot reports whether a call takes a MaxConcurrent slot: MaxConcurrent bounds
// reconciles and their calls, so daemons and webhook calls take none, and a call made
// inside a call of e runs where its outer call runs: in the slot the outer call holds (a
// reconcile's handler calls cannot deadlock waiting for the slot their own reconcile
// holds), or, inside a daemon or a webhook call, in none.
func (e *Executor) needsSlot(ctx context.Context, o *internal.CallOptions) bool {
	if e.slots == nil || o.Daemon || o.NoSlot {
		return false
	}
	outer, ok := ctx.Value(internal.CallKey{}).(*call)
	return !ok || outer.e != e
}

// acquire takes a MaxConcurrent slot, giving up when ctx ends or the drain begins.
func (e *Executor) acquire(ctx context.Context, o *internal.CallOptions) error {
	select {
	case e.slots <- struct{}{}:
		return nil
	default:
	}
	select {
	case e.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.draining:
		return e.refuse(o)
	}
}

func (e *Executor) refuse(o *internal.CallOptions) error {
	e.refused.Add(1)
	return fmt.Errorf("failed to run call %q: %w", internal.Cut(o.FullName()), ErrDraining)
}

// Drain refuses new calls, then waits for every tracked call to return, logging reports of
// what it still waits for. It returns nil when all returned, or, when ctx ends first, a
// *PendingError naming each call still running (errors.Is(err, context.DeadlineExceeded) or
// Canceled holds), each counted in Stats.Abandoned once. Drain is idempotent; concurrent
// Drains all wait. A nil ctx waits without limit.
//
// As it begins, the drain cancels the contexts of daemons (see Pending.Daemon), and of
// every call at CancelAfter. Reports are logged on Options.Clock, the first
// ReportAfter after the drain began and then every ReportEvery, while a Drain waits and a
// call is pending. Drain returns as soon as the last call returns. Once it returned, no
// report follows: it waits for a line being logged at that moment (at most 100ms), and
// leaves no goroutine nor timer behind, except the CancelAfter timer while it is due.
// Calls still running when a Drain gives up keep running and stay tracked; a later Drain
// waits for them again.
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
	e.drainOnce.Do(func() { e.beginDrain(e.cancelAfter(ctx)) })
	defer e.stopWaiting()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-e.done: // both were ready: the calls did return
		return nil
	default:
	}
	calls, _ := e.list(-1)
	for _, c := range calls {
		if c.count(countedAbandoned) {
			e.abandoned.Add(1)
		}
	}
	return &PendingError{Pending: e.locate(calls), Err: ctx.Err()}
}

// stopWaiting ends a Drain's wait: the last one stops the reports, and waits (a little)
// for a line being logged, so that no report follows Drain's return.
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
		t := time.NewTimer(100 * time.Millisecond)
		defer t.Stop()
		select {
		case <-lineDone:
		case <-t.C: // a blocked Logger does not hold the drain up longer
		}
	}
}

// cancelAfter returns when a drain that Drain(ctx) begins cancels the calls (see
// Options.CancelAfter): CancelAtOnce, a longer delay, or a negative one for never.
func (e *Executor) cancelAfter(ctx context.Context) time.Duration {
	if e.opts.CancelAfter != 0 {
		return e.opts.CancelAfter
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return CancelAtOnce
	}
	return max(time.Until(dl)/5*4, CancelAtOnce)
}

// beginDrain is the drain's first step, run once, by a Drain counted in e.waiters. It
// cancels the calls cancelAfter after it began (see Executor.cancelAfter).
func (e *Executor) beginDrain(cancelAfter time.Duration) {
	// Refuse new calls and tell the world, under the lock: a refused caller (which checks
	// isDraining under it) always finds Draining() closed, and the timers exist once
	// Draining() is closed (a test stepping a fake clock right after cannot miss them). A
	// call admitted before this is listed, so it is waited for and cancelled.
	e.mu.Lock()
	e.isDraining = true
	idle := e.inFlight == 0
	if idle {
		e.labels = nil // see unlink
	}
	stopTimer(e.slowTimer)
	if !idle {
		e.armReport(e.opts.ReportAfter)
		if cancelAfter > CancelAtOnce {
			// On a goroutine of its own, as the reports: a fake clock calls the func with its
			// lock held, and cancelCalls takes e.mu, which a report holds while it stops its
			// timer (a lock-order inversion with k8s.io/utils' newer fake clock).
			e.cancelTmr = e.clock.AfterFunc(cancelAfter, func() { go e.cancelCalls(false) })
		}
	}
	close(e.draining)
	e.mu.Unlock()
	if idle {
		executors.release(e.hold)
		close(e.done)
		return
	}
	e.cancelCalls(cancelAfter != CancelAtOnce)
}

// armReport arms the next report in d. The caller holds e.mu.
func (e *Executor) armReport(d time.Duration) {
	// A new timer each time, not Reset: the fake clocks' AfterFunc timers fire only once.
	stopTimer(e.report)
	// A fake clock calls the func with its lock held: the report needs the clock.
	e.report = e.clock.AfterFunc(d, func() { go e.reportDue() })
}

// cancelCalls ends the contexts of the admitted calls: as the drain begins (atStart), the
// daemons' and those of calls marked CancelAtStop; at CancelAfter, all. The drain calls it
// once no call can be admitted any more, so it reaches every call. The calls it cut (daemons
// aside: stopping is their job) are counted in Stats.Cancelled and named in one line.
func (e *Executor) cancelCalls(atStart bool) {
	cause := errCancelledByDrain
	if atStart {
		cause = internal.ErrCancelAtStop
	} else {
		e.mu.Lock()
		if e.cancelCause == nil { // a fence's cause stays
			e.cancelCause = errCancelledByDrain
		}
		e.mu.Unlock()
	}
	calls, _ := e.list(-1)
	var cut []*call
	for _, c := range calls {
		switch {
		case c.opts.Daemon:
			c.cancel(errCancelledByDrain)
		case !atStart || c.opts.CancelAtStop:
			c.cancel(cause)
			if c.since.Load() != sinceLeft && c.count(countedCancelled) { // fn still runs
				cut = append(cut, c)
			}
		}
	}
	if len(cut) == 0 {
		return
	}
	e.cancelled.Add(uint64(len(cut)))
	// On a goroutine of its own, as the reports (a Logger that blocks delays nothing), and
	// waited for by the last Drain, so that the line comes before the drain's end.
	lineDone := make(chan struct{})
	e.mu.Lock()
	e.lineDone = lineDone
	e.mu.Unlock()
	go func() {
		defer close(lineDone)
		// Named, not located: a capture of every stack is for the reports.
		listed := make([]Pending, min(len(cut), internal.MaxListed))
		for i := range listed {
			listed[i] = cut[i].pending()
		}
		kv := e.stopKV("cancelled", len(cut), "cause", cause.Error(), "calls", entries(listed, e.clock.Now()))
		if more := len(cut) - len(listed); more > 0 {
			kv = append(kv, "more", more)
		}
		e.safely(func() { e.log.Info("Cancelling calls still running", kv...) })
	}()
}

// stopKV returns the key/values a drain's line starts with (internal.Settings.StopKV),
// then kv.
func (e *Executor) stopKV(kv ...any) []any {
	if e.settings.StopKV == nil {
		return kv
	}
	return append(e.settings.StopKV(), kv...)
}

// list returns the admitted calls, oldest first: all, or the oldest limit; and how many
// are admitted.
func (e *Executor) list(limit int) (calls []*call, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	total = int(e.inFlight)
	n := total
	if limit >= 0 && limit < n {
		n = limit
	}
	calls = make([]*call, 0, n)
	for c := e.oldest; c != nil && len(calls) < n; c = c.next {
		calls = append(calls, c)
	}
	return calls, total
}

// Pending returns a snapshot of the calls admitted and not yet returned, oldest first.
// A call shows from the moment Call, Go or Run admitted it. Where and Handler are left
// empty: Locate fills them.
func (e *Executor) Pending() []Pending {
	e.mustBeCreated()
	calls, _ := e.list(-1)
	out := make([]Pending, len(calls))
	for i, c := range calls {
		out[i] = c.pending()
	}
	return out
}

// Locate is Pending with Where and Handler filled, from a capture of every goroutine's
// stack. One capture serves every report, Locate, and PendingError that asks while it is
// taken or in the second after; its cost grows with the goroutines of the process (see
// docs/performance.md). It returns the oldest limit calls (all if limit < 0) and how
// many are pending.
func (e *Executor) Locate(limit int) (calls []Pending, total int) {
	e.mustBeCreated()
	cs, total := e.list(limit)
	return e.locate(cs), total
}

// Draining returns a channel closed when Drain begins.
func (e *Executor) Draining() <-chan struct{} {
	e.mustBeCreated()
	return e.draining
}

// Stats returns the executor's counters.
func (e *Executor) Stats() Stats {
	e.mustBeCreated()
	// Finished before Started: a call is counted started before it can finish.
	s := Stats{Finished: e.finished.Load()}
	e.mu.Lock()
	s.InFlight = e.inFlight
	for c := e.oldest; c != nil; c = c.next {
		if !c.opts.Daemon {
			s.Oldest = c.start
			break
		}
	}
	s.Slow = e.countSlow(e.clock.Now())
	e.mu.Unlock()
	s.Started = e.started.Load()
	s.Refused = e.refused.Load()
	s.Panicked = e.panicked.Load()
	s.Abandoned = e.abandoned.Load()
	s.Cancelled = e.cancelled.Load()
	return s
}

// FromContext reports whether ctx is, or derives from (through Value lookups, as
// context.WithCancel and context.WithValue do), the context that a tracked call's fn got
// from Call, Go or Run; if so it returns that call's executor and name. For nested calls
// it names the innermost one. It never blocks.
func FromContext(ctx context.Context) (ex *Executor, name string, ok bool) {
	if ctx == nil {
		return nil, "", false
	}
	c, ok := ctx.Value(internal.CallKey{}).(*call)
	if !ok {
		return nil, "", false
	}
	return c.e, c.name(), true
}
