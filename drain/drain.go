package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// Options configure an Executor. The zero value is valid: every zero field means the
// documented default.
type Options struct {
	// Logger receives the pending reports and the panics of calls started with Go.
	// The zero value discards everything.
	Logger logr.Logger

	// MaxConcurrent bounds how many fn run at once. 0 (or negative): unbounded.
	// When > 0, Call and Go wait for a free slot, honouring their ctx and the drain.
	MaxConcurrent int

	// ReportAfter is how long Drain waits before its first report of pending calls.
	// 0 or negative: 1s.
	ReportAfter time.Duration

	// ReportEvery is the interval between later reports. 0 or negative: 5s.
	ReportEvery time.Duration

	// CancelAfter is how long after Drain began the contexts of calls still running are
	// cancelled. 0: at once; >0: after that long; <0: never.
	CancelAfter time.Duration

	// Clock schedules the reports and CancelAfter and stamps calls' start times.
	// nil: clock.RealClock{}.
	Clock clock.WithTicker

	// AfterCall, if set, is called on the call's goroutine right after fn returns, with
	// the call's name, how long fn ran and its error (the *PanicError if fn panicked).
	// It must not block; it is meant for a duration histogram.
	AfterCall func(name string, took time.Duration, err error)
}

// ErrDraining is returned (wrapped) by Call and Go once the executor drains.
var ErrDraining = errors.New("executor is draining")

// ErrInvalidCall is returned (wrapped) by Call and Go for an empty name or a nil fn.
var ErrInvalidCall = errors.New("invalid call")

// Pending describes a call that has not returned yet.
type Pending struct {
	Name     string
	Started  time.Time
	Detached bool   // its caller stopped waiting; only the executor still tracks it
	Where    string // where its goroutine is blocked: "pkg.Func (file.go:123)"; filled in reports
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

// PendingError is returned by Drain when its ctx ends before every call returned.
type PendingError struct {
	Pending []Pending
	Err     error
}

func (e *PendingError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "failed to drain: %v: %d call(s) still running", e.Err, len(e.Pending))
	for i, p := range e.Pending {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(p.Name)
		if p.Where != "" {
			fmt.Fprintf(&b, " at %s", p.Where)
		}
	}
	return b.String()
}

// Unwrap returns the error of Drain's ctx.
func (e *PendingError) Unwrap() error { return e.Err }

// Stats are the executor's counters, for metrics (drain stays free of Prometheus).
type Stats struct {
	InFlight  int64  // calls admitted and not yet returned (running or waiting for a MaxConcurrent slot)
	Started   uint64 // calls whose fn began
	Finished  uint64 // calls whose fn returned (including panics)
	Refused   uint64 // Call/Go refused because the executor drains (not bad input)
	Panicked  uint64
	Abandoned uint64 // calls still running when a Drain gave up (its ctx ended)
}

// Executor runs named calls on tracked goroutines. Create it with New; all its methods are
// safe for concurrent use.
type Executor struct {
	opts Options
}

// New returns an Executor configured by opts.
func New(opts Options) *Executor {
	return &Executor{opts: opts}
}

// Call runs fn on a tracked goroutine and waits until fn returns or ctx ends.
// If ctx ends first, Call returns ctx.Err() at once, and fn keeps running, still tracked:
// Drain waits for it and reports it as detached. If ctx is already done, Call returns
// ctx.Err() without running fn. After Drain began, Call runs nothing and returns an error
// for which errors.Is(err, ErrDraining) holds. An empty name or a nil fn gives an error
// wrapping ErrInvalidCall.
// fn's context carries ctx's values, ends when ctx ends, and also when the drain cancels it.
// A panic in fn never crashes the process: Call returns a *PanicError with the value and stack.
func (e *Executor) Call(ctx context.Context, name string, fn func(context.Context) error) error {
	return fn(ctx)
}

// Go is Call without waiting: it returns once fn is tracked (or refused). With
// MaxConcurrent > 0 it first waits for a slot like Call. A panic in fn is logged and
// counted.
func (e *Executor) Go(ctx context.Context, name string, fn func(context.Context) error) error {
	go fn(ctx)
	return nil
}

// Drain refuses new calls, then waits for every tracked call to return, logging reports of
// what it still waits for. It returns nil when all returned, or, when ctx ends first, a
// *PendingError naming each call still running (errors.Is(err, context.DeadlineExceeded) or
// Canceled holds). Drain is idempotent; concurrent Drains all wait.
func (e *Executor) Drain(ctx context.Context) error {
	return nil
}

// Pending returns a snapshot of the calls that have not returned, oldest first. Where is
// left empty: capturing stacks is reserved for reports.
func (e *Executor) Pending() []Pending { return nil }

// Draining returns a channel closed when Drain begins.
func (e *Executor) Draining() <-chan struct{} { return nil }

// Stats returns the executor's counters.
func (e *Executor) Stats() Stats { return Stats{} }

// SetDriven marks the executor as driven by an owner that will Drain it when it stops
// (runnable.Runnable sets it in Start). reconcilers.Wrap reads it: while driven, a wrapped
// reconcile's context is shielded from the caller's cancellation and ends by the drain's
// CancelAfter instead.
func (e *Executor) SetDriven(bool) {}

// Driven reports whether SetDriven(true) was called last.
func (e *Executor) Driven() bool { return false }
