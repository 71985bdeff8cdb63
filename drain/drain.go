package drain

import (
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

// Options configure an Executor. The zero value is valid: every zero field means the
// documented default.
type Options struct {
	// Logger receives the reports of pending and slow calls, and the panics of calls
	// started with Go. The zero value discards everything. A Logger that panics or blocks
	// never crashes the process nor delays the drain: reports are logged on a goroutine
	// of their own, one at a time.
	Logger logr.Logger

	// MaxConcurrent bounds how many fn run at once. 0 or negative: unbounded.
	// When > 0, Call, Go and Run wait for a free slot, honouring their ctx and the drain.
	MaxConcurrent int

	// ReportAfter is how long Drain waits before its first report of pending calls.
	// 0 or negative: 1s.
	ReportAfter time.Duration

	// ReportEvery is the interval between later reports, and the least interval between
	// two reports of slow calls. 0 or negative: 5s.
	ReportEvery time.Duration

	// CancelAfter is how long after Drain began the contexts of calls still running are
	// cancelled. 0: at once; >0: after that long; <0: never.
	CancelAfter time.Duration

	// SlowAfter: while the executor is not draining, calls running longer than this are
	// logged as slow ("Slow calls"), at most once per ReportEvery, nothing while none is.
	// 0: 1 minute, the API server's default request timeout: a call running longer is
	// not waiting on a healthy API server, and a reconcile that long holds one of the
	// controller's workers. Negative: never. It costs nothing per call: one timer per
	// executor, armed while calls run; it needs a Clock with AfterFunc
	// (clock.WithDelayedExecution, as clock.RealClock and the fake clocks have).
	SlowAfter time.Duration

	// Clock schedules the reports, CancelAfter and SlowAfter, and stamps calls' start
	// times. nil: clock.RealClock{}.
	Clock clock.WithTicker
}

// ErrDraining is returned (wrapped) by Call, Go and Run once the executor drains.
var ErrDraining = errors.New("executor is draining")

// ErrInvalidCall is returned (wrapped) by Call, Go and Run for a nil ctx, an empty name or
// a nil fn.
var ErrInvalidCall = errors.New("invalid call")

// Unknown is what Where and Handler say when a call's location cannot be determined; the
// executor logs once why.
const Unknown = "unknown"

// NotStarted is what Where and Handler say for a call admitted whose fn has not begun.
const NotStarted = "not started"

// Pending describes a call that has not returned yet.
type Pending struct {
	Name     string
	Started  time.Time // when the call was admitted
	Detached bool      // its caller stopped waiting; only the executor still tracks it
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
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("call %q panicked: %v", e.Name, e.Value)
}

// Unwrap returns the panic value when it is an error, so that errors.Is and errors.As
// see through a panic(err).
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// PendingError is returned by Drain when its ctx ends before every call returned.
// Pending holds every call still running; Error names only the first maxListed.
type PendingError struct {
	Pending []Pending
	Err     error
}

func (e *PendingError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "failed to drain: %v: %d call(s) still running", e.Err, len(e.Pending))
	for i, p := range e.Pending {
		if i == maxListed {
			fmt.Fprintf(&b, " and %d more", len(e.Pending)-maxListed)
			break
		}
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(p.Name)
		if p.Where != "" {
			b.WriteString(" at ")
			b.WriteString(p.Where)
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

	// Oldest is when the oldest pending call was admitted; zero while none is pending.
	Oldest time.Time
	// Slow counts the pending calls that have run for SlowAfter or longer (0 when it is
	// off), as the "Slow calls" line would list them now.
	Slow int64
}

// maxListed bounds how many calls a report, a log line or an error lists; the rest are
// only counted.
const maxListed = 20

// Defaults of Options (documented there).
const (
	defaultReportAfter = time.Second
	defaultReportEvery = 5 * time.Second
	defaultSlowAfter   = time.Minute
)

// Executor runs named calls on tracked goroutines. Create it with New; all its methods are
// safe for concurrent use. An Executor drains once: after Drain began it refuses every call
// for the rest of its life.
type Executor struct {
	opts  Options
	clock clock.WithTicker
	log   logr.Logger
	slots chan struct{} // MaxConcurrent tokens; nil when unbounded
	// With the real clock, calls' start times are base plus the monotonic time since base:
	// one clock read (time.Since) instead of two (time.Now) per call.
	realTime bool
	base     time.Time
	settings internal.Settings
	signals  sync.Pool // chan struct{} (cap 1) on which fn's goroutine tells Call that fn returned

	// mu guards admission and the list of admitted calls: a call is admitted, listed and
	// counted in one step, so that Drain, Pending and the counters always agree.
	mu         sync.Mutex
	oldest     *call // the admitted calls, a list in admission order, oldest first
	newest     *call
	inFlight   int64
	isDraining bool
	slowTimer  clock.Timer // armed while calls are in flight, see checkSlow
	slowArmed  bool

	draining  chan struct{} // closed when Drain begins
	done      chan struct{} // closed when draining and nothing is in flight
	drainOnce sync.Once
	waiters   atomic.Int32  // Drain calls waiting; reports are logged only while one waits
	logging   atomic.Bool   // a report is being logged (see logAsync)
	unknown   atomic.Uint32 // reasons for an unknown location already logged (bits)

	started, finished, refused, panicked, abandoned atomic.Uint64
}

// New returns an Executor configured by opts; zero fields of opts take their defaults.
func New(opts Options) *Executor {
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
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	e := &Executor{
		opts:     opts,
		clock:    opts.Clock,
		log:      opts.Logger,
		draining: make(chan struct{}),
		done:     make(chan struct{}),
	}
	if opts.MaxConcurrent > 0 {
		e.slots = make(chan struct{}, opts.MaxConcurrent)
	}
	switch opts.Clock.(type) {
	case clock.RealClock, *clock.RealClock:
		e.realTime, e.base = true, time.Now()
	}
	// The pool belongs to the executor, not the package: a channel made inside a
	// testing/synctest bubble must not be used outside it.
	e.signals.New = func() any { return make(chan struct{}, 1) }
	return e
}

// now returns the time on e's clock. With the real clock it follows the monotonic clock
// from New on, so a step of the wall clock does not show in calls' start times.
func (e *Executor) now() time.Time {
	if e.realTime {
		return e.base.Add(time.Since(e.base))
	}
	return e.clock.Now()
}

// Call runs fn on a tracked goroutine and waits until fn returns or ctx ends.
// If ctx ends first, Call returns ctx.Err() at once, and fn keeps running, still tracked:
// Drain waits for it and reports it as detached. If ctx is already done, Call returns
// ctx.Err() without running fn. After Drain began, Call runs nothing and returns an error
// for which errors.Is(err, ErrDraining) holds. A nil ctx, an empty name or a nil fn give
// an error wrapping ErrInvalidCall.
//
// fn's context carries ctx's values and deadline, ends when ctx ends, when the drain
// cancels it (see Options.CancelAfter), and when fn returns. fn's goroutine carries the
// pprof label "quiesce" (so do the contexts derived from fn's), by which reports find it.
// A panic in fn never crashes the process: Call returns a *PanicError with the value and
// stack. If fn calls runtime.Goexit, Call returns an error.
//
// With MaxConcurrent > 0, Call first waits for a free slot; while it waits, ctx ending
// returns ctx.Err() and the drain beginning refuses the call.
func (e *Executor) Call(ctx context.Context, name string, fn func(context.Context) error) error {
	return e.call(ctx, internal.CallOptions{Name: [4]string{name}}, fn)
}

func (e *Executor) call(ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
	c, err := e.admit(ctx, &o, fn)
	if err != nil {
		return err
	}
	sig := e.signals.Get().(chan struct{})
	c.sig = sig
	go c.work()
	if done := ctx.Done(); done == nil {
		<-sig // a plain receive is cheaper than a select
	} else {
		select {
		case <-sig:
		case <-done:
			if c.state.CompareAndSwap(callWaiting, callDetached) {
				// fn's goroutine will not signal: sig is clean and can be reused.
				e.signals.Put(sig)
				return ctx.Err()
			}
			<-sig // fn returned meanwhile; take its result instead
		}
	}
	err = c.err
	e.signals.Put(sig)
	return err
}

// Go is Call without waiting: it returns nil once fn is tracked, or the error that Call
// would return without running fn. With MaxConcurrent > 0 it first waits for a slot like
// Call. Nobody waits for fn's result: Pending reports the call as detached, and a panic
// in fn is logged (message "Call panicked") and counted.
func (e *Executor) Go(ctx context.Context, name string, fn func(context.Context) error) error {
	c, err := e.admit(ctx, &internal.CallOptions{Name: [4]string{name}}, fn)
	if err != nil {
		return err
	}
	c.state.Store(callDetached)
	go c.work()
	return nil
}

// Run runs fn as a tracked call on the caller's goroutine and returns fn's result. It is
// Call without the hand-off to a goroutine, for callers that wait for fn anyway
// (reconcilers.Wrap: controller-runtime's worker waits for its reconcile).
//
// Run blocks until fn returns, even when ctx ends first: then fn's context ends, and Run
// still waits for fn and returns its result (it never detaches). Everything else is as
// for Call: admission, refusal, bad input, MaxConcurrent, fn's context. While fn runs,
// the caller's goroutine carries the pprof label "quiesce"; Run then restores the labels
// of ctx, as pprof.Do does. A panic in fn is recovered: Run returns a *PanicError. If fn
// calls runtime.Goexit, the call is settled and the caller's goroutine exits, as it would
// calling fn directly.
func (e *Executor) Run(ctx context.Context, name string, fn func(context.Context) error) error {
	return e.run(ctx, internal.CallOptions{Name: [4]string{name}}, fn)
}

func (e *Executor) run(ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
	c, err := e.admit(ctx, &o, fn)
	if err != nil {
		return err
	}
	r := runners.Get().(*runner)
	defer r.release(ctx) // deferred: a Goexit or a re-raised panic must restore the labels too
	r.enter()
	c.exec(r)
	return c.err
}

// admit checks the input, waits for a MaxConcurrent slot, and lists the call unless the
// executor drains.
func (e *Executor) admit(ctx context.Context, o *internal.CallOptions, fn func(context.Context) error) (*call, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("failed to run call %q: nil context: %w", joinName(&o.Name), ErrInvalidCall)
	case o.Name == [4]string{}:
		return nil, fmt.Errorf("failed to run call: empty name: %w", ErrInvalidCall)
	case fn == nil:
		return nil, fmt.Errorf("failed to run call %q: nil func: %w", joinName(&o.Name), ErrInvalidCall)
	}
	if done := ctx.Done(); done != nil {
		select {
		case <-done:
			return nil, ctx.Err()
		default:
		}
	}
	if e.slots != nil {
		if err := e.acquire(ctx, o); err != nil {
			return nil, err
		}
	}
	c := &call{
		parent:     ctx,
		e:          e,
		name:       o.Name,
		controller: o.Controller,
		fn:         fn,
		shield:     o.Shield && e.settings.Driven,
		repanic:    o.Repanic,
		start:      e.now(),
	}
	e.mu.Lock()
	if e.isDraining {
		e.mu.Unlock()
		if e.slots != nil {
			<-e.slots
		}
		return nil, e.refuse(o)
	}
	e.link(c)
	e.mu.Unlock()
	return c, nil
}

// link lists c as the newest call. The caller holds e.mu.
func (e *Executor) link(c *call) {
	e.started.Add(1)
	e.inFlight++
	c.prev = e.newest
	if e.newest != nil {
		e.newest.next = c
	} else {
		e.oldest = c
	}
	e.newest = c
	if !e.slowArmed {
		e.armSlow(e.opts.SlowAfter)
	}
}

// unlink forgets a settled call; the last one to leave a draining executor ends the drain.
func (e *Executor) unlink(c *call) {
	e.mu.Lock()
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
	e.mu.Unlock()
	if last {
		close(e.done)
	}
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
	return fmt.Errorf("failed to run call %q: %w", joinName(&o.Name), ErrDraining)
}

// Drain refuses new calls, then waits for every tracked call to return, logging reports of
// what it still waits for. It returns nil when all returned, or, when ctx ends first, a
// *PendingError naming each call still running (errors.Is(err, context.DeadlineExceeded) or
// Canceled holds), each counted in Stats.Abandoned once. Drain is idempotent; concurrent
// Drains all wait. A nil ctx waits without limit.
//
// Drain returns as soon as the last call returns. Reports are logged on Options.Clock, the
// first ReportAfter after the drain began and then every ReportEvery, while a Drain waits
// and a call is pending. Calls still running when a Drain gives up keep running and stay
// tracked; a later Drain waits for them again.
func (e *Executor) Drain(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	e.waiters.Add(1)
	defer e.waiters.Add(-1)
	e.drainOnce.Do(e.beginDrain)
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
		if c.abandoned.CompareAndSwap(false, true) {
			e.abandoned.Add(1)
		}
	}
	return &PendingError{Pending: e.locate(calls), Err: ctx.Err()}
}

// beginDrain is the drain's first step, run once.
func (e *Executor) beginDrain() {
	// Timers first, so that they exist on a fake clock once Draining() is closed.
	var cancelTimer clock.Timer
	if e.opts.CancelAfter > 0 {
		cancelTimer = e.clock.NewTimer(e.opts.CancelAfter)
	}
	reportTimer := e.clock.NewTimer(e.opts.ReportAfter)

	// Tell the world, then refuse new calls: a refused caller always finds Draining()
	// closed. A call admitted before this is listed, so it is waited for and cancelled.
	close(e.draining)
	e.mu.Lock()
	e.isDraining = true
	idle := e.inFlight == 0
	if e.slowTimer != nil {
		e.slowTimer.Stop()
	}
	e.mu.Unlock()
	if idle {
		close(e.done)
	}
	if e.opts.CancelAfter == 0 {
		e.cancelCalls()
	}
	go e.supervise(cancelTimer, reportTimer)
}

// supervise fires CancelAfter and the reports until the drain ends. It never waits for
// the Logger (see logAsync), so that a blocking Logger cannot delay CancelAfter.
func (e *Executor) supervise(cancelTimer, reportTimer clock.Timer) {
	defer reportTimer.Stop()
	var cancelC <-chan time.Time
	if cancelTimer != nil {
		defer cancelTimer.Stop()
		cancelC = cancelTimer.C()
	}
	for {
		select {
		case <-e.done:
			return
		case <-cancelC:
			cancelC = nil
			e.cancelCalls()
		case <-reportTimer.C():
			select {
			case <-e.done: // the last call returned as the report fell due: no report
				return
			default:
			}
			// Re-arm first: the schedule does not drift by the time a report takes.
			reportTimer.Reset(e.opts.ReportEvery)
			if e.waiters.Load() > 0 {
				e.logAsync(e.reportPending)
			}
		}
	}
}

// cancelCalls ends the contexts of all admitted calls. The drain calls it once no call can
// be admitted any more, so it reaches every call.
func (e *Executor) cancelCalls() {
	calls, _ := e.list(-1)
	for _, c := range calls {
		c.cancel(context.Canceled)
	}
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
	calls, _ := e.list(-1)
	out := make([]Pending, len(calls))
	for i, c := range calls {
		out[i] = c.pending()
	}
	return out
}

// Locate is Pending with Where and Handler filled, from one capture of every goroutine's
// stack (the cost grows with the goroutines of the process: ~3 ms for 100, ~300 ms for
// 10,000). It returns the oldest limit calls (all if limit < 0) and how many are pending.
func (e *Executor) Locate(limit int) (calls []Pending, total int) {
	cs, total := e.list(limit)
	return e.locate(cs), total
}

// Draining returns a channel closed when Drain begins.
func (e *Executor) Draining() <-chan struct{} { return e.draining }

// Stats returns the executor's counters.
func (e *Executor) Stats() Stats {
	// Finished before Started: a call is counted started before it can finish.
	s := Stats{Finished: e.finished.Load()}
	e.mu.Lock()
	s.InFlight = e.inFlight
	if e.oldest != nil {
		s.Oldest = e.oldest.start
		s.Slow = e.countSlow(e.now())
	}
	e.mu.Unlock()
	s.Started = e.started.Load()
	s.Refused = e.refused.Load()
	s.Panicked = e.panicked.Load()
	s.Abandoned = e.abandoned.Load()
	return s
}

// callKey is the key under which fn's context (a *call) returns itself from Value.
type callKey struct{}

// FromContext reports whether ctx is, or derives from (through Value lookups, as
// context.WithCancel and context.WithValue do), the context that a tracked call's fn got
// from Call, Go or Run; if so it returns that call's executor and name. For nested calls
// it names the innermost one. It never blocks.
func FromContext(ctx context.Context) (ex *Executor, name string, ok bool) {
	if ctx == nil {
		return nil, "", false
	}
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return nil, "", false
	}
	return c.e, c.Name(), true
}

func init() {
	internal.SettingsOf = func(ex any) *internal.Settings { return &ex.(*Executor).settings }
	internal.Run = func(ex any, ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
		return ex.(*Executor).run(ctx, o, fn)
	}
	internal.Call = func(ex any, ctx context.Context, o internal.CallOptions, fn func(context.Context) error) error {
		o.Repanic = false
		return ex.(*Executor).call(ctx, o, fn)
	}
	internal.CallOf = func(ctx context.Context) (any, internal.CallOptions, bool) {
		if ctx == nil {
			return nil, internal.CallOptions{}, false
		}
		c, ok := ctx.Value(callKey{}).(*call)
		if !ok {
			return nil, internal.CallOptions{}, false
		}
		return c.e, internal.CallOptions{Name: [4]string{c.Name()}, Controller: c.controller, Shield: c.shield}, true
	}
}
