package drain

import (
	"context"
	"math"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
)

// Label ids are "<executor number>-<n>", held from link to unlink; once a drain is over they
// go to the next executor. A capture locates only calls labelled before it began (since).

// labelKey is the pprof label key of goroutines running a call's fn.
const labelKey = "quiesce"

// call.since: 0, then the first capture epoch that sees its label, sinceLeft once fn returned.
const sinceLeft = math.MaxUint64

// A label is one of an executor's ids, with its label set and labels made once.
type label struct {
	id     string
	set    pprof.LabelSet       // quiesce=id
	labels any                  // what a context with the set alone answers labelsKey; nil without labelsKey
	call   atomic.Pointer[call] // the call holding it, or nil; written under Executor.mu
}

// labelsKey is the key under which runtime/pprof keeps a context's labels (unexported
// there), learnt once by asking pprof to read a context that notes the key it is asked.
// With it, a call whose caller has no labels answers the key itself, with its label's
// labels made once (call.Value), instead of a pprof.WithLabels context per call. nil if
// pprof ever stops asking a context this way: then every call takes pprof.WithLabels.
var labelsKey = func() any {
	var k keyNoter
	pprof.Label(&k, labelKey)
	return k.key
}()

// keyNoter is a context that notes the key it was last asked for.
type keyNoter struct {
	context.Context // nil: only Value is called
	key             any
}

func (k *keyNoter) Value(key any) any {
	k.key = key
	return nil
}

// labelsByID holds every label made: a Run nested in another executor's call relabels its
// goroutine, and the outer call is found through the inner id (labelled).
var labelsByID sync.Map

// labelTable is an executor's number and label ids, guarded by its Executor.mu.
type labelTable struct {
	num  uint64   // the executor's number, the prefix of its ids
	made int      // the ids made: "<num>-1" to "<num>-<made>"
	free []*label // those no call holds
}

// tableHold is an executor's hold on its table until executors takes it back.
type tableHold struct{ t *labelTable } // guarded by executors.mu

// takeLabel gives c a free label of e. The caller holds e.mu (see link).
func (e *Executor) takeLabel(c *call) {
	t := e.labels
	var l *label
	if n := len(t.free); n > 0 {
		l = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		t.made++
		id := strconv.FormatUint(t.num, 10) + "-" + strconv.Itoa(t.made)
		l = &label{id: id, set: pprof.Labels(labelKey, id)}
		if labelsKey != nil {
			l.labels = pprof.WithLabels(context.Background(), l.set).Value(labelsKey)
		}
		labelsByID.Store(id, l)
	}
	l.call.Store(c)
	c.label = l
}

// enter adds c's label to fn's context, merged with the caller's as pprof.Do merges them
// (if the caller has none, c answers with its label's own: call.Value), and labels the
// goroutine, before reading the capture epoch (later captures see it).
func (c *call) enter() {
	if !c.ownLabels {
		c.ctx = pprof.WithLabels(c.ctx, c.label.set)
	}
	pprof.SetGoroutineLabels(c.ctx)
	c.since.Store(captureEpoch.Load() + 1)
}

// leave restores the goroutine's labels: Run's caller's ctx's, as pprof.Do does; none for
// Call and Go, whose goroutine ends.
func (c *call) leave() {
	c.since.Store(sinceLeft)
	ctx := context.Background()
	if c.onCaller {
		ctx = c.Context
	}
	pprof.SetGoroutineLabels(ctx)
}

// labelled returns the call holding the label id, if its goroutine carried it before the
// capture of epoch began.
func labelled(id string, epoch uint64) *call {
	if l, ok := labelsByID.Load(id); ok {
		if c := l.(*label).call.Load(); c != nil {
			if since := c.since.Load(); since != 0 && since <= epoch { // never sinceLeft
				return c
			}
		}
	}
	return nil
}

// executors numbers executors and recycles their label tables; never written per call.
var executors struct {
	mu   sync.Mutex
	last uint64
	free []*labelTable
}

// addExecutor numbers e, reusing a released table, until its drain is over or it is collected.
func addExecutor(e *Executor) {
	executors.mu.Lock()
	defer executors.mu.Unlock()
	var t *labelTable
	if n := len(executors.free); n > 0 {
		t = executors.free[n-1]
		executors.free[n-1] = nil
		executors.free = executors.free[:n-1]
	} else {
		executors.last++
		t = &labelTable{num: executors.last}
	}
	e.labels, e.hold = t, &tableHold{t: t}
	runtime.AddCleanup(e, releaseTable, e.hold)
}

// releaseTable takes back h's table, once: its drain is over or its executor was collected.
func releaseTable(h *tableHold) {
	executors.mu.Lock()
	defer executors.mu.Unlock()
	if h.t != nil {
		executors.free = append(executors.free, h.t)
		h.t = nil
	}
}
