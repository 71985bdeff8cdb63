package drain

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/quiesce-dev/quiesce/internal"
)

// call is one admitted call, and the context that fn's derives from: the caller's ctx
// answering internal.CallKey and the call's pprof labels itself (Value), so that neither
// takes a context of its own, and, when shielded, ignoring ctx's cancellation as
// context.WithoutCancel does (Deadline, Done, Err, Value). fn's context is a standard
// WithCancelCause child of it: Done, Err, context.Cause, AfterFunc and children's
// cancellation are the standard library's. A record is never reused: a goroutine that
// outlived its call and still holds fn's context finds that call, never another.
type call struct {
	context.Context // the caller's ctx

	e     *Executor
	opts  internal.CallOptions
	start time.Time

	onCaller  bool // Run: fn runs on the caller's goroutine
	slot      bool // holds a MaxConcurrent slot, given back by finish
	panicked  bool // fn panicked: err is its *PanicError; written before done is closed
	ownLabels bool // the caller's ctx has no pprof labels: Value answers with the label's own
	shielded  bool // fn's context ignores ctx's cancellation (CallOptions.Shield, Owned)

	prev, next *call // the executor's list, guarded by Executor.mu

	ctx         context.Context         // fn's: newCall makes it, enter adds the caller's labels
	cancelCause context.CancelCauseFunc // ends ctx with a cause; the first cause wins
	stopTimer   context.CancelFunc      // releases a shielded call's deadline; nil if none

	label *label        // its label id, from link (labels.go)
	since atomic.Uint64 // 0 until fn begins, sinceLeft once it returned (labels.go)

	done    chan struct{} // closed when fn returned and err is set, for Call; nil otherwise
	state   atomic.Uint32 // callWaiting, callDetached or callFinished
	counted atomic.Uint32 // countedAbandoned, countedCancelled: in Stats already
	err     error         // fn's result, written before done is closed
}

// Bits of call.counted; count marks c counted for bit and reports whether it was not yet.
const (
	countedAbandoned uint32 = 1 << iota
	countedCancelled
)

func (c *call) count(bit uint32) bool { return c.counted.Or(bit)&bit == 0 }

// States of call.state: who takes fn's result.
const (
	callWaiting  uint32 = iota // Call or Run waits for the result
	callDetached               // nobody waits (Go, or Call's ctx ended first)
	callFinished               // fn returned and the result was handed over
)

var (
	errGoexit           = errors.New("fn called runtime.Goexit")
	errFinished         = errors.New("call returned")          // fn's context's cause once fn returned
	errCancelledByDrain = errors.New("cancelled by the drain") // at CancelAfter; daemons as it begins
	// errCancelledForCleanup: before CancelAfter, to keep the call's cleanup window.
	errCancelledForCleanup = errors.New("cancelled by the drain, its cleanup window before the abandon")
)

// newCall makes the call and fn's context: a WithCancelCause child of the call (with ctx's
// deadline below it when shielded on an owned executor).
func newCall(ctx context.Context, e *Executor, o *internal.CallOptions, slot bool) *call {
	// Stamped outside e.mu; link keeps the list ordered by the stamps.
	c := &call{Context: ctx, e: e, opts: *o, slot: slot, start: e.opts.Clock.Now()}
	c.ownLabels = labelsKey != nil && ctx.Value(labelsKey) == nil
	var base context.Context = c
	if o.Shield && e.settings.Owned {
		c.shielded = true
		if d, ok := ctx.Deadline(); ok {
			base, c.stopTimer = context.WithDeadline(base, d)
		}
	}
	c.ctx, c.cancelCause = context.WithCancelCause(base)
	return c
}

// Value answers internal.CallKey with c and, once c holds its label, pprof's labels with
// its own when the caller has none. It passes every other key on to ctx.
func (c *call) Value(key any) any {
	switch {
	case key == internal.CallKey{}:
		return c
	case c.ownLabels && key == labelsKey && c.label != nil:
		return c.label.labels
	}
	return c.Context.Value(key)
}

// Deadline, Done and Err are ctx's, or, shielded, those of context.WithoutCancel(ctx):
// none (so context.Cause and AfterFunc of it see no cancellation either). The record does
// this itself: WithoutCancel's context costs an allocation, and another at each Value
// asked through it (it passes itself on boxed).
func (c *call) Deadline() (time.Time, bool) {
	if c.shielded {
		return time.Time{}, false
	}
	return c.Context.Deadline()
}

func (c *call) Done() <-chan struct{} {
	if c.shielded {
		return nil
	}
	return c.Context.Done()
}

func (c *call) Err() error {
	if c.shielded {
		return nil
	}
	return c.Context.Err()
}

// String names c as the context package names its contexts, by kind: never a call's name
// nor a value (fmt prints a context through it, and fn's through its parent's).
func (c *call) String() string {
	s := "context.Context"
	if p, ok := c.Context.(fmt.Stringer); ok {
		s = p.String()
	}
	if c.shielded {
		s += ".WithoutCancel"
	}
	return s + ".WithValue(internal.CallKey, *drain.call)"
}

// cancel ends fn's context with cause, unless it ended already, and releases its deadline.
func (c *call) cancel(cause error) {
	c.cancelCause(cause)
	if c.stopTimer != nil {
		c.stopTimer()
	}
}

// funcHandler is a func as an internal.Handler (one pointer: no allocation).
type funcHandler func(context.Context) error

func (f funcHandler) Handle(ctx context.Context) error { return f(ctx) }

func noFunc(fn internal.Handler) bool {
	f, isFunc := fn.(funcHandler)
	return fn == nil || isFunc && f == nil
}

func (c *call) name() string { return c.opts.FullName() }

// Core and Options make c an internal.Call.
func (c *call) Core() internal.Core           { return (*core)(c.e) }
func (c *call) Options() internal.CallOptions { return c.opts }

// Rename makes c an internal.Call: see there.
func (c *call) Rename(name string) {
	c.e.mu.Lock()
	c.opts.Name, c.opts.Namespace, c.opts.Object = name, "", ""
	c.e.mu.Unlock()
}

// pendings returns each call's Pending, without Where and Handler. calls are of one
// executor; their names are read under its lock (Rename).
func pendings(calls []*call) []Pending {
	out := make([]Pending, len(calls))
	if len(calls) == 0 {
		return out
	}
	calls[0].e.mu.Lock()
	defer calls[0].e.mu.Unlock()
	for i, c := range calls {
		out[i] = Pending{
			Name:        c.name(),
			Started:     c.start,
			Detached:    c.state.Load() == callDetached,
			Daemon:      c.opts.Daemon,
			ReconcileID: c.opts.ReconcileID,
		}
		if c.counted.Load()&countedCancelled != 0 {
			out[i].cleanup = c.e.settings.CleanupOf(c.opts.Controller)
		}
	}
	return out
}

// outer returns the tracked call whose fn's context c's caller passed, if any.
func (c *call) outer() *call {
	a, _ := c.Context.Value(internal.CallKey{}).(*call)
	return a
}

// exec runs fn with the call's label and settles the call however fn ends: return, panic or
// runtime.Goexit (told from a nil panic by whether the inner function returned).
func (c *call) exec(fn internal.Handler) {
	c.enter()
	var err error
	settled, returned := false, false
	defer func() {
		if !settled { // runtime.Goexit: nothing was recovered, the goroutine goes on exiting
			c.finish(fmt.Errorf("failed to run call %q: %w", internal.Cut(c.name()), errGoexit))
		}
	}()
	func() {
		defer func() {
			if v := recover(); v != nil { // nil: runtime.Goexit, or panic(nil), told apart below
				settled = true
				pe := c.panicError(v)
				c.finish(pe)
				if c.opts.Repanic && c.onCaller {
					c.raising(pe)
					panic(v) // Run: raised here, the panic keeps fn's frames below it
				}
			}
		}()
		err = fn.Handle(c.ctx)
		returned = true
	}()
	if settled {
		return
	}
	settled = true
	if !returned { // a panic(nil) that recover could not tell from no panic
		c.finish(c.panicError(nil))
		if c.opts.Repanic && c.onCaller {
			panic(nil) // re-raise exactly what fn raised
		}
		return
	}
	c.finish(err)
}

// raising tells an outer tracked call that pe, fn's panic, is raised again on its goroutine
// (as if it had called fn: RecoverPanic sees it), so that it counts it once, with fn's stack.
func (c *call) raising(pe *PanicError) {
	if outer := c.outer(); outer != nil {
		outer.e.anyRaised.Store(true)
		outer.e.raised.Store(outer, pe)
	}
}

func (c *call) panicError(v any) *PanicError {
	c.panicked = true
	if r, ok := c.e.raised.LoadAndDelete(c); ok && samePanic(r.(*PanicError).Value, v) {
		return r.(*PanicError) // a nested call's panic raised again: counted once, with its stack
	}
	c.e.panicked.Add(1)
	return &PanicError{Name: c.name(), Value: v, Stack: debug.Stack()}
}

// samePanic reports whether v is the value raised again: equal, or of its type if incomparable.
func samePanic(raised, v any) bool {
	return reflect.TypeOf(raised) == reflect.TypeOf(v) &&
		(raised == nil || !reflect.ValueOf(raised).Comparable() || raised == v)
}

// finish settles c with fn's result and hands it to whoever waits.
func (c *call) finish(err error) {
	e := c.e
	c.leave()
	if e.anyRaised.Load() {
		e.raised.Delete(c) // a nested panic raised again that fn recovered: forgotten
	}
	if c.slot {
		<-e.slots
	}
	e.finished.Add(1)
	if after := e.settings.AfterCall; after != nil {
		e.afterCall(after, c, err)
	}
	c.cancel(errFinished)
	c.err = err
	waited := c.state.CompareAndSwap(callWaiting, callFinished)
	if !waited && err != nil {
		e.logPanic(err)
	}
	e.unlink(c)                  // a call its caller saw return is not pending
	if waited && c.done != nil { // nil for Run, which reads c.err on this goroutine
		close(c.done)
	}
}

// logPanic logs err if it is a panic, before the call is unlisted (Drain returns after).
func (e *Executor) logPanic(err error) {
	var pe *PanicError
	if errors.As(err, &pe) {
		internal.Safely(func() {
			e.opts.Logger.Error(err, "Call panicked",
				"call", internal.Cut(pe.Name), "panic", internal.Cut(fmt.Sprint(pe.Value)), "stack", string(pe.Stack))
		})
	}
}

// afterCall calls the AfterCall hook; a panic in it is logged, never raised.
func (e *Executor) afterCall(after func(string, time.Duration, error), c *call, err error) {
	defer func() {
		if v := recover(); v != nil {
			internal.Safely(func() {
				e.opts.Logger.Error(fmt.Errorf("%v", v), "AfterCall panicked",
					"call", internal.Cut(c.name()), "stack", string(debug.Stack()))
			})
		}
	}()
	after(c.opts.Controller, e.opts.Clock.Since(c.start), err)
}
