package drain

import "context"

// Run runs fn as a tracked call on the caller's goroutine and returns fn's result. It is
// Call without the hand-off to a worker goroutine, for callers that wait for fn anyway
// (reconcilers.Wrap: controller-runtime's worker waits for its reconcile).
//
// Run blocks until fn returns, even when ctx ends first: then fn's context ends, and Run
// still waits for fn and returns its result (it never detaches, so Pending never reports
// a Run'd call as detached). Everything else is as for Call: if ctx is already done, Run
// returns ctx.Err() without running fn; after Drain began it runs nothing and returns an
// error for which errors.Is(err, ErrDraining) holds; an empty name, a nil fn or a nil ctx
// give an error wrapping ErrInvalidCall; with MaxConcurrent > 0 it first waits for a free
// slot, honouring ctx and the drain.
//
// fn's context is the same as with Call: ctx's values and deadline, ended by ctx, by the
// drain (see Options.CancelAfter), and when fn returns. The call counts in Pending, Stats,
// Options.AfterCall and reports like any other; reports show where the caller's goroutine
// is blocked inside fn. A panic in fn is recovered: Run returns a *PanicError with the
// value and stack. If fn calls runtime.Goexit, the call is settled and the caller's
// goroutine exits, as it would calling fn directly.
func (e *Executor) Run(ctx context.Context, name string, fn func(context.Context) error) error {
	c, err := e.admit(ctx, name, fn)
	if err != nil {
		return err
	}
	// c.state is callWaiting and c.sig nil: finish leaves the result in c.err.
	w := e.borrowRunner()
	defer e.returnRunner(w) // deferred: runtime.Goexit in fn must not lose the slot
	w.spell(w.digits, c)
	return c.err
}

// A runner is a worker without a goroutine of its own: Run borrows one to spell its id
// on the caller's goroutine. Runners keep their slot in Executor.workers and their id for
// the executor's life; there are as many as Runs ever ran at once.

// borrowRunner takes an idle runner, or makes one with a slot and an id of its own.
func (e *Executor) borrowRunner() *worker {
	e.rmu.Lock()
	if n := len(e.runners); n > 0 {
		w := e.runners[n-1]
		e.runners = e.runners[:n-1]
		e.rmu.Unlock()
		return w
	}
	e.rmu.Unlock()
	e.wmu.Lock()
	slot, id := e.newSlot(), newID()
	w := &worker{e: e, slot: slot, id: id, digits: spellDigits(id)}
	e.workers[slot] = w
	e.wmu.Unlock()
	return w
}

// returnRunner makes w available to the next Run.
func (e *Executor) returnRunner(w *worker) {
	e.rmu.Lock()
	e.runners = append(e.runners, w)
	e.rmu.Unlock()
}

// callKey is the key under which fn's context (a *call) returns itself from Value.
type callKey struct{}

// FromContext reports whether ctx is, or derives from (through Value lookups, as
// context.WithCancel and context.WithValue do), the context that a tracked call's fn got
// from Call, Go or Run; if so it returns that call's executor and name. For nested calls
// it names the innermost one. It never blocks and does not allocate.
func FromContext(ctx context.Context) (ex *Executor, name string, ok bool) {
	if ctx == nil {
		return nil, "", false
	}
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return nil, "", false
	}
	return c.e, c.name, true
}
