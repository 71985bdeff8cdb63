package drain

import (
	"context"
	"runtime/pprof"
	"strconv"
	"sync"
)

// While fn runs, its goroutine carries the pprof label quiesce=<id>, by which a goroutine
// profile tells which call a stack belongs to (see locate.go). The ids are shared by every
// executor of the process and reused: there are never more of them than calls running at
// once, so a continuous profiler sees a bounded set of values. A reused id cannot mislead a
// report: a label is given back only after its goroutine dropped it, a capture locates
// only calls labelled before it began (see label.seq), and among the goroutines carrying an
// id, the call's own is the one running exec (goroutines fn started carry its labels too).

// labelKey is the pprof label key of goroutines running a call's fn.
const labelKey = "quiesce"

// A label is one id, with its label context ready.
type label struct {
	id  string
	ctx context.Context // pprof.WithLabels(context.Background(), quiesce=id)

	// seq orders the labellings of the process: set when a call took the label, after
	// its goroutine carried it.
	seq  uint64
	call *call // the call that holds it
}

// labels are the process's label ids.
var labels struct {
	mu     sync.Mutex
	free   []*label
	n      int               // ids made
	seq    uint64            // last label.seq given
	active map[string]*label // by id, the labels held by a call
}

// enter gives c a free label, labels the current goroutine with it (merged with the
// labels of c's caller, as pprof.Do merges them) and returns it. The goroutine carries the
// label before the label gets its seq: a capture that saw the seq saw the label.
func (c *call) enter() *label {
	var pairs []string
	pprof.ForLabels(c.parent, func(k, v string) bool {
		if k != labelKey {
			pairs = append(pairs, k, v)
		}
		return true
	})
	c.entered.Store(true)

	labels.mu.Lock()
	var l *label
	if n := len(labels.free); n > 0 {
		l = labels.free[n-1]
		labels.free = labels.free[:n-1]
	} else {
		labels.n++
		id := strconv.Itoa(labels.n)
		l = &label{id: id, ctx: pprof.WithLabels(context.Background(), pprof.Labels(labelKey, id))}
	}
	c.labels = l.ctx
	if pairs != nil { // the caller has labels of its own: fn keeps them
		c.labels = pprof.WithLabels(context.Background(), pprof.Labels(append(pairs, labelKey, l.id)...))
	}
	pprof.SetGoroutineLabels(c.labels)
	labels.seq++
	l.seq, l.call = labels.seq, c
	if labels.active == nil {
		labels.active = make(map[string]*label)
	}
	labels.active[l.id] = l
	labels.mu.Unlock()
	c.label.Store(l)
	return l
}

// leave restores the labels of the current goroutine, once it no longer runs fn (Run's
// caller's, as pprof.Do restores them; none on a goroutine of Call or Go, which is about
// to end), then takes l back from c.
func (c *call) leave(l *label) {
	c.label.Store(nil)
	if c.onCaller {
		pprof.SetGoroutineLabels(c.parent)
	} else {
		pprof.SetGoroutineLabels(context.Background())
	}
	labels.mu.Lock()
	delete(labels.active, l.id)
	l.call = nil
	labels.free = append(labels.free, l)
	labels.mu.Unlock()
}

// heldLabel returns the label that c holds and its seq, or nil.
func (c *call) heldLabel() (*label, uint64) {
	l := c.label.Load()
	if l == nil {
		return nil, 0
	}
	labels.mu.Lock()
	defer labels.mu.Unlock()
	if l.call != c {
		return nil, 0
	}
	return l, l.seq
}

// labelled returns the call holding the label id since seq or before, if any.
func labelled(id string, seq uint64) *call {
	labels.mu.Lock()
	defer labels.mu.Unlock()
	if l := labels.active[id]; l != nil && l.seq <= seq {
		return l.call
	}
	return nil
}
