package drain

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// call is one admitted call. It is also fn's context (see context.go): one allocation per
// call, and it is never reused, because fn may keep its context after returning.
type call struct {
	parent     context.Context
	e          *Executor
	name       [4]string // joined by Name when needed
	controller string
	fn         func(context.Context) error
	shield     bool // ignore the parent's cancellation, not its deadline
	repanic    bool
	start      time.Time

	prev, next *call // the executor's list, guarded by Executor.mu

	runner    atomic.Pointer[runner] // set while fn runs: the label fn's goroutine carries
	sig       chan struct{}          // Call waits on it; nil for Go and Run
	state     atomic.Uint32          // callWaiting, callDetached or callFinished
	err       error                  // fn's result, for Call and Run; written before sig is signalled
	abandoned atomic.Bool            // counted in Stats.Abandoned already

	ctxState // fn's context
}

// Call hand-off states.
const (
	callWaiting  uint32 = iota // Call or Run waits for the result
	callDetached               // nobody waits (Go, or Call's ctx ended first)
	callFinished               // fn returned and the result was handed over
)

// errGoexit is the result of a call whose fn called runtime.Goexit (e.g. t.FailNow).
var errGoexit = errors.New("fn called runtime.Goexit")

// Name returns the call's name.
func (c *call) Name() string { return joinName(&c.name) }

// joinName joins the non-empty parts of a call's name with "/".
func joinName(parts *[4]string) string {
	n, only := 0, ""
	for _, p := range parts {
		if p != "" {
			n++
			only = p
		}
	}
	if n <= 1 {
		return only
	}
	var b []byte
	for _, p := range parts {
		if p == "" {
			continue
		}
		if len(b) > 0 {
			b = append(b, '/')
		}
		b = append(b, p...)
	}
	return string(b)
}

func (c *call) pending() Pending {
	return Pending{Name: c.Name(), Started: c.start, Detached: c.state.Load() == callDetached}
}

// A runner is the identity that a goroutine carries while it runs a call's fn: a pprof
// label, by which a goroutine profile tells which call a stack belongs to (see locate).
// Its label context is built once and reused, so a call costs no label allocation;
// runners are pooled, and their ids are never reused, so a label names one runner for the
// life of the process.
type runner struct {
	id     string
	labels context.Context // pprof.WithLabels(Background, labelKey=id)
}

// labelKey is the pprof label key of goroutines running a call's fn.
const labelKey = "quiesce"

var (
	runnerIDs atomic.Uint64
	runners   = sync.Pool{New: func() any {
		id := "r" + strconv.FormatUint(runnerIDs.Add(1), 10)
		return &runner{id: id, labels: pprof.WithLabels(context.Background(), pprof.Labels(labelKey, id))}
	}}
)

// enter labels the current goroutine with r.
func (r *runner) enter() { pprof.SetGoroutineLabels(r.labels) }

// release restores the labels of ctx on the current goroutine and gives r back.
func (r *runner) release(ctx context.Context) {
	pprof.SetGoroutineLabels(ctx)
	runners.Put(r)
}

// work runs c on a new goroutine (Call and Go). Starting a goroutine per call costs less
// than handing calls to parked workers, and leaves nothing behind when the executor idles.
func (c *call) work() {
	r := runners.Get().(*runner)
	r.enter()
	c.exec(r)
	runners.Put(r) // not deferred: after a Goexit the runner is simply dropped
}

// exec runs fn on r and settles the call however fn ends: it returns, it panics, or it
// calls runtime.Goexit. It tells a recovered nil panic (GODEBUG=panicnil=1) from a Goexit
// by whether the inner function returned, as golang.org/x/sync/singleflight does.
func (c *call) exec(r *runner) {
	c.runner.Store(r)
	settled := false
	defer func() {
		if !settled { // runtime.Goexit: nothing was recovered, the goroutine goes on exiting
			c.finish(fmt.Errorf("failed to run call %q: %w", c.Name(), errGoexit))
		}
	}()
	var err error
	returned := false
	func() {
		defer func() {
			if returned {
				return
			}
			v := recover()
			if v == nil {
				return // runtime.Goexit, or a recovered panic(nil): told apart below
			}
			settled = true
			c.finish(c.panicError(v))
			if c.repanic {
				// Raised from this deferred call, the panic keeps fn's frames below it:
				// whoever recovers it next sees the stack where fn panicked.
				panic(v)
			}
		}()
		err = c.fn(c)
		returned = true
	}()
	if settled {
		return
	}
	settled = true
	if !returned { // a panic(nil) that recover could not tell from no panic
		c.finish(c.panicError(nil))
		if c.repanic {
			panic(nil) // re-raise exactly what fn raised
		}
		return
	}
	c.finish(err)
}

func (c *call) panicError(v any) *PanicError {
	c.e.panicked.Add(1)
	return &PanicError{Name: c.Name(), Value: v, Stack: debug.Stack()}
}

// finish settles c with fn's result err: counts it, ends fn's context, unlists it, and
// hands err to whoever waits.
func (c *call) finish(err error) {
	e := c.e
	c.runner.Store(nil)
	if e.slots != nil {
		<-e.slots
	}
	e.finished.Add(1)
	if after := e.settings.AfterCall; after != nil {
		e.afterCall(after, c, err)
	}
	c.cancel(context.Canceled) // fn's context ends with fn
	c.err = err
	waited := c.state.CompareAndSwap(callWaiting, callFinished)
	e.unlink(c)
	if waited {
		if c.sig != nil { // nil for Run, which reads c.err on this goroutine
			c.sig <- struct{}{}
		}
		return
	}
	var pe *PanicError
	if err != nil && errors.As(err, &pe) {
		e.safely(func() {
			e.log.Error(err, "Call panicked", "call", pe.Name, "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
		})
	}
}

// afterCall calls the AfterCall hook; a panic in it is logged, never raised.
func (e *Executor) afterCall(after func(string, time.Duration, error), c *call, err error) {
	defer func() {
		if v := recover(); v != nil {
			e.safely(func() {
				e.log.Error(fmt.Errorf("%v", v), "AfterCall panicked", "call", c.Name(), "stack", string(debug.Stack()))
			})
		}
	}()
	after(c.controller, e.clock.Since(c.start), err)
}

// safely runs log, a call of the Logger, and contains a panic in it: a broken Logger must
// not crash the process nor lose a call.
func (e *Executor) safely(log func()) {
	defer func() { _ = recover() }()
	log()
}
