package drain

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// fn's context is its *call. It is not a context.WithCancel of the caller's ctx because
// that costs two allocations and a lock on the parent per call; here nothing is allocated
// unless fn asks for Done (or derives a context from it), which many short calls never do.

// ctxState is the cancellation state of fn's context.
type ctxState struct {
	ctxErr  atomic.Uint32 // errNone until the context ended; read without the lock
	ctxDone atomic.Value  // chan struct{}, made by the first Done

	mu         sync.Mutex
	stopParent func() bool // stops watching the caller's ctx
	deadline   *time.Timer // shielded: ends the context at the caller's deadline
	afterFuncs []*afterFunc
}

type afterFunc struct{ f func() }

// Values of ctxState.ctxErr. A context's Err is Canceled or DeadlineExceeded, so a code
// stores it without the cost of an atomic.Value. errOther: the caller's ctx broke that
// rule, and Err asks it again.
const (
	errNone uint32 = iota
	errCanceled
	errDeadline
	errOther
)

// loadErr returns the context's error, nil while it has not ended.
func (c *call) loadErr() error {
	switch c.ctxErr.Load() {
	case errNone:
		return nil
	case errCanceled:
		return context.Canceled
	case errDeadline:
		return context.DeadlineExceeded
	}
	if err := c.parentErr(); err != nil {
		return err
	}
	return context.Canceled
}

// parentErr is the caller's ctx's error as fn's context sees it: a shielded call ignores
// the caller's cancellation, not its deadline.
func (c *call) parentErr() error {
	err := c.parent.Err()
	if err == nil || !c.shield || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if d, ok := c.parent.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// setErr ends the context with err. The caller holds c.mu and saw errNone.
func (c *call) setErr(err error) {
	switch err {
	case context.Canceled:
		c.ctxErr.Store(errCanceled)
	case context.DeadlineExceeded:
		c.ctxErr.Store(errDeadline)
	default: // only the caller's ctx gives other errors (see parentErr)
		c.ctxErr.Store(errOther)
	}
}

var _ context.Context = (*call)(nil)

// Deadline is the caller's deadline.
func (c *call) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Value is the caller's value; for callKey (see FromContext) it is the call itself, and
// for pprof's label key the labels of fn's goroutine: so pprof.Do inside fn keeps them,
// and a Run inside fn restores them.
func (c *call) Value(key any) any {
	if _, ok := key.(callKey); ok {
		return c
	}
	if r := c.runner.Load(); r != nil {
		if v := r.labels.Value(key); v != nil {
			return v
		}
	}
	return c.parent.Value(key)
}

// Err is nil until the context ended, then the caller's error, or context.Canceled when
// the drain cancelled the call or fn returned.
func (c *call) Err() error {
	if err := c.loadErr(); err != nil {
		return err
	}
	// Done may never have been asked for, so nobody watches the caller's ctx: look now.
	if err := c.parentErr(); err != nil {
		c.cancel(err)
		return c.loadErr()
	}
	return nil
}

// Done is closed when the context ends. The channel, and a watch on the caller's ctx, are
// made on the first call.
func (c *call) Done() <-chan struct{} {
	if d, _ := c.ctxDone.Load().(chan struct{}); d != nil {
		return d
	}
	c.mu.Lock()
	d, _ := c.ctxDone.Load().(chan struct{})
	if d != nil {
		c.mu.Unlock()
		return d
	}
	d = make(chan struct{})
	c.ctxDone.Store(d)
	if c.ctxErr.Load() != errNone {
		close(d)
		c.mu.Unlock()
		return d
	}
	if c.parent.Done() != nil {
		c.stopParent = context.AfterFunc(c.parent, c.parentDone)
	}
	c.mu.Unlock()
	return d
}

// parentDone follows the caller's ctx when it ends. A shielded call ignores a
// cancellation, but still ends at the caller's deadline, on a timer of its own.
func (c *call) parentDone() {
	if err := c.parentErr(); err != nil {
		c.cancel(err)
		return
	}
	d, ok := c.parent.Deadline()
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctxErr.Load() == errNone {
		c.deadline = time.AfterFunc(time.Until(d), func() { c.cancel(context.DeadlineExceeded) })
	}
}

// AfterFunc lets contexts derived from fn's context (context.WithCancel and friends)
// register with it, as they do with the standard library's contexts, instead of starting
// a goroutine each to watch Done. f runs when the context ends.
func (c *call) AfterFunc(f func()) (stop func() bool) {
	c.Done() // make sure the caller's ctx is watched
	c.mu.Lock()
	if c.ctxErr.Load() != errNone {
		c.mu.Unlock()
		// The context package may hold a lock of its own that f takes: never run f here.
		go f()
		return func() bool { return false }
	}
	af := &afterFunc{f: f}
	c.afterFuncs = append(c.afterFuncs, af)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := 0
		for i < len(c.afterFuncs) && c.afterFuncs[i] != af {
			i++
		}
		if i == len(c.afterFuncs) {
			return false
		}
		c.afterFuncs = append(c.afterFuncs[:i], c.afterFuncs[i+1:]...)
		return true
	}
}

// cancel ends the context with err, unless it ended already.
func (c *call) cancel(err error) {
	c.mu.Lock()
	if c.ctxErr.Load() != errNone {
		c.mu.Unlock()
		return
	}
	c.setErr(err)
	if d, _ := c.ctxDone.Load().(chan struct{}); d != nil {
		close(d)
	}
	stop, funcs, deadline := c.stopParent, c.afterFuncs, c.deadline
	c.stopParent, c.afterFuncs, c.deadline = nil, nil, nil
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	if deadline != nil {
		deadline.Stop()
	}
	// Outside the lock: these funcs cancel derived contexts, which read this one's Err.
	for _, af := range funcs {
		af.f()
	}
}

// String names the context, as the standard library's contexts do.
func (c *call) String() string { return "drain.Call(" + c.Name() + ")" }
