package internal

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"
)

// Settings are the settings of one executor that only quiesce's own packages change.
// AfterCall is set before the executor is shared and only read after that; Driven may be
// set at any time.
type Settings struct {
	// Driven: a runnable.Runnable drains the executor when its manager stops (set by
	// runnable.Add and runnable.Runnable.Start). The contexts of calls started from then on
	// with CallOptions.Shield ignore their caller's cancellation (not its deadline) and end
	// by the drain (drain.Options.CancelAfter) instead.
	Driven atomic.Bool

	// AfterCall, if set, is called on the call's goroutine right after fn returned, with
	// the call's controller (CallOptions.Controller, "" for calls that have none), how long
	// fn ran and its error (the *drain.PanicError if fn panicked). It must not block.
	// A panic in it is logged, never raised.
	AfterCall func(controller string, took time.Duration, err error)

	// Observers are told of slow and abandoned calls (reconcilers.Options.Recorder adds one).
	Observers Observers
}

// CallOptions shape one tracked call started through Run, Call or Go.
type CallOptions struct {
	// Name is the call's name.
	Name string

	// Controller is the controller given to reconcilers.Wrap that the call belongs to,
	// for the metrics; "" for any other call.
	Controller string

	// ReconcileID is controller-runtime's reconcileID of the wrapped reconcile the call
	// is, or runs inside; "" for any other call. Reports show it.
	ReconcileID string

	// Shield: if the executor is Driven, fn's context ignores ctx's cancellation (it keeps
	// ctx's deadline and values) and ends when the drain cancels the call.
	Shield bool

	// Repanic: a panic in fn is raised again on the caller's goroutine once the executor
	// settled and counted the call. Run raises the original value (its stack is the
	// caller's); Call raises the *drain.PanicError, which carries the value and fn's stack.
	// Go ignores it.
	Repanic bool

	// Tag is the caller's own mark of the call, passed to Observers (reconcilers sets the
	// reconcile's request, and Call inherits it); nil for calls that have none.
	Tag any

	// Daemon: the call is meant to run until the drain stops it (a per-object daemon).
	// It is listed with drain.Pending.Daemon set, never counted or logged as slow, and its
	// context is cancelled the moment the drain begins, not at CancelAfter. It never waits
	// for nor holds a MaxConcurrent slot.
	Daemon bool

	// NoSlot: the call never waits for nor holds a MaxConcurrent slot (webhook calls:
	// MaxConcurrent bounds reconciles and their calls only).
	NoSlot bool
}

// Core is what quiesce's packages use of a *drain.Executor beyond its public methods.
// drain implements it; Of returns it.
type Core interface {
	// Settings returns the executor's settings, to be changed before it is shared.
	Settings() *Settings
	// Run is drain.Executor.Run shaped by o.
	Run(ctx context.Context, o CallOptions, fn func(context.Context) error) error
	// Call is drain.Executor.Call shaped by o.
	Call(ctx context.Context, o CallOptions, fn func(context.Context) error) error
	// Go is drain.Executor.Go shaped by o: it returns nil once fn is tracked, or the
	// error of a refused call (errors.Is(err, drain.ErrDraining) once the drain began).
	Go(ctx context.Context, o CallOptions, fn func(context.Context) error) error
	// Abandoned tells the Observers of every call still running, located. runnable calls
	// it once, at the end of the grace period; it returns when they did.
	Abandoned(ctx context.Context)
	// Fence ends the context of every call still running at once, with cause, and returns
	// how many it ended. runnable calls it when the lease is lost, once the drain began.
	Fence(cause error) int
}

// Hidden is embedded in drain.Executor under an unexported field name: its method core is
// promoted to *drain.Executor, which so satisfies Executor, without adding anything to
// drain's public API.
type Hidden struct{ c Core }

// NewHidden returns the Hidden that gives c.
func NewHidden(c Core) Hidden { return Hidden{c: c} }

func (h Hidden) core() Core { return h.c }

// Executor is a *drain.Executor, as the packages of this module see it: the only type
// outside this package with the method core (promoted from Hidden).
type Executor interface{ core() Core }

// NotCreated is the panic of every method of a drain.Executor that drain.New did not
// create (a zero or nil one), and of Of given one.
const NotCreated = "drain: Executor not created by drain.New (use drain.New(drain.Options{}))"

// Of returns the Core of ex, a non-nil *drain.Executor. It panics with NotCreated if ex is
// a zero drain.Executor (one drain.New did not create): reconcilers.Wrap and the others
// that call it when set up fail there, not at their first call.
func Of(ex Executor) Core {
	c := ex.core()
	if c == nil {
		panic(NotCreated)
	}
	return c
}

// CallKey is the context key under which fn's context (and every context derived from
// it) returns its Call.
type CallKey struct{}

// Call is a tracked call as its fn's context tells it: see CallOf.
type Call interface {
	// Executor returns the call's executor.
	Executor() Executor
	// Options returns the options the call was started with.
	Options() CallOptions
}

// CallOf returns the innermost tracked call whose fn's context ctx is, or derives from.
func CallOf(ctx context.Context) (Call, bool) {
	if ctx == nil {
		return nil, false
	}
	c, ok := ctx.Value(CallKey{}).(Call)
	return c, ok
}

// Age rounds d for reading, as reports, errors and /debug/quiesce show a call's age: whole
// seconds from 1s on, milliseconds below.
func Age(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// MaxNameBytes bounds the bytes of a name that a log line, a report entry, an error or
// /debug/quiesce shows; Cut marks a longer one.
const MaxNameBytes = 256

// Cut returns s, or, when s is longer than MaxNameBytes, its first MaxNameBytes bytes
// (never splitting a UTF-8 sequence) followed by "...(N bytes)", N being len(s).
func Cut(s string) string {
	if len(s) <= MaxNameBytes {
		return s
	}
	n := MaxNameBytes
	for n > 0 && !startsRune(s[n]) {
		n--
	}
	return s[:n] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// startsRune reports whether b can begin a UTF-8 sequence (it is no continuation byte).
func startsRune(b byte) bool { return b&0xC0 != 0x80 }

// Entry is one pending call as a report line, the abandoned line and /debug/quiesce show
// it. Name, Where and Handler are cut to MaxNameBytes.
type Entry struct {
	Name        string `json:"name"`
	Age         string `json:"age"`
	Detached    bool   `json:"detached"`
	Daemon      bool   `json:"daemon,omitempty"`
	ReconcileID string `json:"reconcileID,omitempty"`
	Where       string `json:"where"`
	Handler     string `json:"handler"`
}
