package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// idleTimeout is how long a parked worker waits for work before it exits. It runs on real
// time, not Options.Clock, on purpose: it only bounds memory, nothing observable depends on
// it, and a fake clock that tests never step would keep workers alive. Tests do not wait for
// it either: a drain makes every idle worker exit at once.
const idleTimeout = 10 * time.Second

// errGoexit is the result of a call whose fn called runtime.Goexit (e.g. t.FailNow).
var errGoexit = errors.New("fn called runtime.Goexit")

// call is one admitted call. It is also fn's context (see context.go): one allocation per
// call, and it is never reused, because fn may keep its context after returning.
type call struct {
	parent context.Context
	e      *Executor
	name   string
	fn     func(context.Context) error

	sig   chan struct{} // Call waits on it; nil for Go and Run
	state atomic.Uint32 // callWaiting, callDetached or callFinished
	err   error         // fn's result, for Call and Run; written before sig is signalled

	// Written by the worker before it publishes the call (worker.cur), read after.
	start time.Time
	seq   uint64 // order in which fns began: oldest first

	abandoned atomic.Bool // counted in Stats.Abandoned already

	ctxState // fn's context
}

// Call handoff states.
const (
	callWaiting  uint32 = iota // Call waits for the result
	callDetached               // nobody waits (Go, or Call's ctx ended first)
	callFinished               // fn returned and the result was handed to Call
)

// worker is a goroutine that runs calls one after another, then parks until the next one,
// so that a call costs a channel handoff instead of a new goroutine.
type worker struct {
	e      *Executor
	slot   uint32               // index in Executor.workers
	id     uint32               // spelled on the stack (see spell); unique in the process
	digits int                  // spellDigits(id)
	wake   chan *call           // cap 1: the next call, or nil to exit
	cur    atomic.Pointer[call] // the call running now, if any
	epoch  uint64               // Executor.epoch when it parked; guarded by Executor.wmu
}

// dispatch hands c to the most recently parked worker, or starts a new one.
//
// Why a stack of parked workers, each on its own channel, rather than one channel they all
// receive from: a worker parks in a plain receive (no select with a timer, which costs a
// timer heap update at every park), and the most recently used workers stay busy while the
// others idle long enough for the janitor to retire them.
func (e *Executor) dispatch(c *call) {
	e.wmu.Lock()
	if n := len(e.idle); n > 0 {
		w := e.idle[n-1]
		e.idle[n-1] = nil
		e.idle = e.idle[:n-1]
		e.wmu.Unlock()
		w.wake <- c
		return
	}
	slot, id := e.newSlot(), newID()
	w := &worker{e: e, slot: slot, id: id, digits: spellDigits(id), wake: make(chan *call, 1)}
	e.workers[slot] = w
	e.wmu.Unlock()
	go w.spell(w.digits, c)
}

// newSlot returns a free slot of e.workers. The caller holds e.wmu.
func (e *Executor) newSlot() uint32 {
	if n := len(e.free); n > 0 {
		slot := e.free[n-1]
		e.free = e.free[:n-1]
		return slot
	}
	e.workers = append(e.workers, nil)
	return uint32(len(e.workers) - 1)
}

// next parks w until it is handed its next call; nil: w should exit (a runner, or a
// worker of a draining executor or idle too long).
func (w *worker) next() *call {
	if w.wake == nil || !w.e.park(w) {
		return nil
	}
	return <-w.wake
}

// park puts w on the idle stack, unless the executor drains: then w should exit.
func (e *Executor) park(w *worker) bool {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.closing {
		return false
	}
	w.epoch = e.epoch
	e.idle = append(e.idle, w)
	if !e.janitorRuns {
		e.janitorRuns = true
		go e.janitor()
	}
	return true
}

// retire forgets an exiting worker.
func (e *Executor) retire(w *worker) {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.workers[w.slot] = nil
	e.free = append(e.free, w.slot)
	freeID(w.id)
}

// janitor retires the workers idle for a whole idleTimeout. It runs only while some worker
// is parked, so that an executor nobody drains leaves no goroutine behind for long.
func (e *Executor) janitor() {
	t := time.NewTimer(idleTimeout)
	defer t.Stop()
	for {
		select {
		case <-e.draining: // the drain wakes the idle workers itself
			return
		case <-t.C:
		}
		e.wmu.Lock()
		e.epoch++
		// The stack is ordered by epoch, oldest at the bottom. Those parked before the
		// previous tick have been idle for at least idleTimeout.
		n := 0
		for n < len(e.idle) && e.idle[n].epoch+1 < e.epoch {
			e.idle[n].wake <- nil
			n++
		}
		e.idle = append(e.idle[:0], e.idle[n:]...)
		if len(e.idle) == 0 {
			e.janitorRuns = false
			e.wmu.Unlock()
			return
		}
		e.wmu.Unlock()
		t.Reset(idleTimeout)
	}
}

// wakeIdle makes every parked worker exit, and those still busy exit when done.
func (e *Executor) wakeIdle() {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.closing = true
	for _, w := range e.idle {
		w.wake <- nil
	}
	e.idle = nil
}

//go:generate go run gen_spell.go

// spellDigits returns how many frames spell takes for id: its base-256 digits.
func spellDigits(id uint32) int {
	n := 1
	for id >>= 8; id != 0; id >>= 8 {
		n++
	}
	return n
}

// ids numbers the workers and runners of all executors: a goroutine profile holds the
// stacks of the whole process, and an id read on a stack must name one worker of one
// executor. Freed ids are reused, smallest digits first, so ids stay small.
var ids struct {
	sync.Mutex
	next uint32
	free []uint32
}

func newID() uint32 {
	ids.Lock()
	defer ids.Unlock()
	if n := len(ids.free); n > 0 {
		id := ids.free[n-1]
		ids.free = ids.free[:n-1]
		return id
	}
	ids.next++
	return ids.next - 1
}

func freeID(id uint32) {
	ids.Lock()
	ids.free = append(ids.free, id)
	ids.Unlock()
}

// begin publishes c as w's running call, just before spell calls its fn.
func (w *worker) begin(c *call) {
	e := w.e
	c.start = e.now()
	c.seq = e.started.Add(1)
	w.cur.Store(c)
	if e.cancelled.Load() {
		c.cancel(context.Canceled)
	}
}

// settle finishes a call whose fn panicked with v, or called runtime.Goexit (v nil).
func (w *worker) settle(c *call, v any) {
	var err error
	if v != nil {
		err = &PanicError{Name: c.name, Value: v, Stack: debug.Stack()}
		w.e.panicked.Add(1)
	} else {
		err = fmt.Errorf("failed to run call %q: %w", c.name, errGoexit)
	}
	w.finish(c, err)
}

// finish settles a call whose fn returned with err.
func (w *worker) finish(c *call, err error) {
	e := w.e
	if e.slots != nil {
		<-e.slots
	}
	e.finished.Add(1)
	if e.opts.AfterCall != nil {
		e.afterCall(c, err)
	}
	w.cur.Store(nil)
	c.cancel(context.Canceled) // fn's context ends with fn

	c.err = err
	waited := c.state.CompareAndSwap(callWaiting, callFinished)
	if !waited {
		var pe *PanicError
		if errors.As(err, &pe) {
			e.log.Error(err, "Call panicked", "call", c.name, "panic", pe.Value, "stack", string(pe.Stack))
		}
	}
	e.release()
	if waited && c.sig != nil { // nil for Run, which reads c.err on this goroutine
		c.sig <- struct{}{}
	}
}

// afterCall calls Options.AfterCall; a panic in it is logged, never raised.
func (e *Executor) afterCall(c *call, err error) {
	defer func() {
		if v := recover(); v != nil {
			e.log.Error(fmt.Errorf("%v", v), "AfterCall panicked", "call", c.name, "stack", string(debug.Stack()))
		}
	}()
	e.opts.AfterCall(c.name, e.clock.Since(c.start), err)
}

// running returns the calls whose fn runs now, in no order.
func (e *Executor) running() []*call {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	calls := make([]*call, 0, len(e.workers))
	for _, w := range e.workers {
		if w == nil {
			continue
		}
		if c := w.cur.Load(); c != nil {
			calls = append(calls, c)
		}
	}
	return calls
}

// pendingCall is a Pending with what fillWhere needs to find its goroutine.
type pendingCall struct {
	Pending
	call   *call
	worker *worker
}

// snapshot returns the running calls, oldest first.
func (e *Executor) snapshot() []pendingCall {
	_, out := e.oldest(-1)
	return out
}

// oldest returns how many calls run, and the oldest limit of them (all if limit < 0),
// oldest first. A report needs only a few: keeping those in one pass, instead of sorting
// thousands, keeps a report with many pending calls cheap.
func (e *Executor) oldest(limit int) (int, []pendingCall) {
	var out []pendingCall
	total := 0
	e.wmu.Lock()
	if limit < 0 {
		out = make([]pendingCall, 0, len(e.workers))
	}
	for _, w := range e.workers {
		if w == nil {
			continue
		}
		c := w.cur.Load()
		if c == nil {
			continue
		}
		total++
		if limit >= 0 && len(out) == limit && c.seq > out[limit-1].call.seq {
			continue
		}
		p := pendingCall{
			Pending: Pending{Name: c.name, Started: c.start, Detached: c.state.Load() == callDetached},
			call:    c,
			worker:  w,
		}
		if limit < 0 {
			out = append(out, p)
			continue
		}
		// Insert in order, dropping the youngest beyond limit.
		i, _ := slices.BinarySearchFunc(out, c.seq, func(p pendingCall, seq uint64) int { return cmp.Compare(p.call.seq, seq) })
		if len(out) < limit {
			out = slices.Insert(out, i, p)
		} else {
			copy(out[i+1:], out[i:limit-1])
			out[i] = p
		}
	}
	e.wmu.Unlock()
	if limit < 0 {
		slices.SortFunc(out, func(a, b pendingCall) int { return cmp.Compare(a.call.seq, b.call.seq) })
	}
	return total, out
}
