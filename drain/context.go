package drain

import (
	"context"
	"time"

	"github.com/quiesce-dev/quiesce/internal"
)

// A call is its fn's context. It answers Deadline and Value itself, Err from its own state
// while nothing needed more, and makes the standard library's context that the call used
// to be made with (see newStd) only when something asks for Done, context.Cause, or a
// child that registers with it (context.WithCancel, WithTimeout, AfterFunc): a reconcile
// answered from the cache asks for none of them and costs no context at all.
//
// Once made, that standard context answers Done, Err and the cause, and the call hands it
// to the context package as its own cancelCtx (Value of the package's cancelCtxKey), with
// the same Done channel: children register with it as with any standard parent, with no
// goroutine each, and context.Cause finds the cause there. Until it is made, Err is worked
// out exactly as that context would report it: the call's own end (fn's return, the
// drain's cancellation), else the caller's cancellation (a call that is not shielded), else
// its deadline (a shielded one); the first of them wins, as in the standard library. A
// fence's cause, any error, is rare: it makes the standard context and cancels it, which
// then answers for everything.

// cancelCtxKey is the context package's unexported key by which a context derived from a
// standard cancelCtx returns it (context.Cause and propagateCancel ask for it). It is
// learned once: context.Cause asks a context whose Err is not nil for that key.
//
// Why a probe: context.Cause reads a cause only from the *cancelCtx that Value returns for
// this key, so a hand-written context can report one only by answering the key with its
// standard context, and must tell the key from others to make that context lazily. The
// alternative without the probe, making the standard context for any key of the key's
// type (*int) and answering when it answers with itself, is as fast for the usual keys
// but makes a standard context (and, shielded with a deadline, a timer) for every call
// whose context is asked for a user's *int key. If the context package ever stops asking
// for it as the probe expects, cancelCtxKey stays nil: context.Cause of a call then
// returns its Err (never a panic), which TestCancelCtxKeyIsTheContextPackages and the
// conformance test report.
var cancelCtxKey = func() any {
	var p keyProbe
	_ = context.Cause(&p)
	return p.key
}()

// keyProbe is an ended context that records the key Value is asked for.
type keyProbe struct{ key any }

func (*keyProbe) Deadline() (time.Time, bool) { return time.Time{}, false }
func (*keyProbe) Done() <-chan struct{}       { return nil }
func (*keyProbe) Err() error                  { return context.Canceled }
func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

// ending is how a call's own context ended while no standard context was made: one of
// the two causes it can end with without one (endedNot while it has not).
type ending uint8

const (
	endedNot      ending = iota
	endedReturned        // errFinished
	endedDrained         // errCancelledByDrain
)

// endingOf returns the ending of cause, endedNot for a cause that needs the standard context.
func endingOf(cause error) ending {
	switch cause {
	case errFinished:
		return endedReturned
	case errCancelledByDrain:
		return endedDrained
	}
	return endedNot
}

// cause returns the cause of the ending.
func (k ending) cause() error {
	if k == endedDrained {
		return errCancelledByDrain
	}
	return errFinished
}

// stdCtx is a call's standard context and its cancel func (which releases its deadline).
type stdCtx struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Deadline is the caller's: a shielded call keeps it too.
func (c *call) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Done returns the channel of the call's standard context, made now if it was not.
func (c *call) Done() <-chan struct{} { return c.stdCtx().Done() }

// Err reports how the context ended, or nil.
func (c *call) Err() error {
	c.ctxMu.Lock()
	defer c.ctxMu.Unlock()
	if c.std != nil {
		return c.std.ctx.Err()
	}
	return c.errLocked()
}

// errLocked is Err while no standard context was made. The caller holds c.ctxMu.
func (c *call) errLocked() error {
	switch {
	case c.ended != endedNot:
		return context.Canceled
	case !c.shielded:
		return c.parent.Err()
	}
	if d, ok := c.parent.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// cancel ends the call's context with cause, unless it ended already. fn's return and the
// drain's cancellation, with no standard context made, are recorded in the call; any other
// cause makes the standard context first.
func (c *call) cancel(cause error) {
	c.ctxMu.Lock()
	if k := endingOf(cause); c.std == nil && k != endedNot {
		if c.errLocked() == nil {
			c.ended = k
		}
		c.ctxMu.Unlock()
		return
	}
	cancel := c.stdLocked().cancel
	c.ctxMu.Unlock()
	cancel(cause)
}

// stdCtx returns the call's standard context, made now if it was not.
func (c *call) stdCtx() context.Context {
	c.ctxMu.Lock()
	defer c.ctxMu.Unlock()
	return c.stdLocked().ctx
}

// stdLocked returns the call's standard context, made now if it was not: as the call's
// context used to be made, then ended as the call's had ended already, if it had. The
// caller holds c.ctxMu.
func (c *call) stdLocked() *stdCtx {
	if c.std == nil {
		ctx, cancel := c.newStd()
		c.std = &stdCtx{ctx: ctx, cancel: cancel}
		if c.ended != endedNot {
			cancel(c.ended.cause())
		}
	}
	return c.std
}

// newStd makes the standard context equal to the call's: a child of the caller's ctx, or,
// shielded, of context.Background with the caller's deadline if it has one. Made after
// the caller's ctx ended or the deadline passed, it has ended too, as the call's has.
func (c *call) newStd() (context.Context, context.CancelCauseFunc) {
	if !c.shielded {
		return context.WithCancelCause(c.parent)
	}
	d, ok := c.parent.Deadline()
	if !ok {
		return context.WithCancelCause(context.Background())
	}
	deadline, stop := context.WithDeadline(context.Background(), d)
	ctx, cancel := context.WithCancelCause(deadline)
	return ctx, func(cause error) { cancel(cause); stop() }
}

// Value answers for the call itself (internal.CallKey, see FromContext), for the context
// package's cancelCtx (its standard context, see above), for pprof's labels (so that
// pprof.Do inside fn, and a Run nested in fn, keep them), and otherwise as the caller's
// ctx: a shielded call keeps its caller's values, the logger and reconcileID included.
func (c *call) Value(key any) any {
	switch key.(type) {
	case internal.CallKey:
		return c
	case *int: // the type of the context package's cancelCtxKey
		if key == cancelCtxKey {
			return c.stdCtx().Value(key)
		}
	}
	if c.labels != nil {
		// c.labels derives from context.Background: it answers for pprof's key alone.
		if v := c.labels.Value(key); v != nil {
			return v
		}
	}
	return c.parent.Value(key)
}
