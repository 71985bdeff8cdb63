package drain

import (
	"context"
	"math"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"weak"
)

// While fn runs, its goroutine carries the pprof label quiesce=<id>, by which a goroutine
// profile tells which call a stack belongs to (see locate.go). Each executor has its own
// ids, "<executor number>-<n>", and reuses them: a call takes one as it is listed and gives
// it back as it is unlisted, under the executor's lock that listing takes anyway, so no
// lock is shared by all executors on the way of a call. An executor's calls carry no more
// values than it has calls listed at once, so a continuous profiler sees a bounded set of
// values per executor. Once an executor's drain is over (or it is garbage collected), its
// number and its ids, label sets made, go to the next executor New makes: short-lived
// executors (one per batch of calls, as errgroup.Group is used) make no ids after the
// first, and the process carries no more numbers than it had executors alive at once.
//
// A reused id cannot mislead a report: an id is given back only after its goroutine
// dropped it; a capture locates only calls whose goroutine carried their label before it
// began (see call.since); and among the goroutines carrying an id, the call's own is the
// one running exec (goroutines fn started carry its labels too).

// labelKey is the pprof label key of goroutines running a call's fn.
const labelKey = "quiesce"

// While its goroutine carries its label, a call's since is the first capture epoch (see
// captureEpoch) that saw the label; before, 0; once fn returned, sinceLeft, after every
// epoch.
const sinceLeft = math.MaxUint64

// A label is one of an executor's ids, with its label set made once.
type label struct {
	id   string
	set  pprof.LabelSet // quiesce=id
	call *call          // the call holding it, or nil; guarded by Executor.mu
}

// labelTable is an executor's number and label ids. Guarded by the Executor.mu of the
// executor holding it.
type labelTable struct {
	num  uint64   // the executor's number, the prefix of its ids
	all  []*label // the ids made: all[n-1] is "<num>-<n>"
	free []*label // those no call holds
}

// tableHold is an executor's hold on its label table, until the registry takes the table
// back (see registry.release). It keeps no executor alive.
type tableHold struct{ t *labelTable } // guarded by registry.mu

// takeLabel gives c a free label of e. The caller holds e.mu (see link).
func (e *Executor) takeLabel(c *call) {
	t := e.labels
	var l *label
	if n := len(t.free); n > 0 {
		l = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		id := strconv.FormatUint(t.num, 10) + "-" + strconv.Itoa(len(t.all)+1)
		l = &label{id: id, set: pprof.Labels(labelKey, id)}
		t.all = append(t.all, l)
	}
	l.call = c
	c.label = l
}

// giveLabel takes c's label back, once c's goroutine dropped it. The caller holds e.mu
// (see unlink).
func (e *Executor) giveLabel(c *call) {
	c.label.call = nil
	e.labels.free = append(e.labels.free, c.label)
}

// enter adds c's label to fn's context, merged with the labels of c's caller as pprof.Do
// merges them (so that pprof.Do inside fn, and a Run nested in fn, keep it), and labels the
// current goroutine with them. The goroutine carries the label before it reads the capture
// epoch: every capture begun after that read saw the label.
func (c *call) enter() {
	c.ctx = pprof.WithLabels(c.ctx, c.label.set)
	pprof.SetGoroutineLabels(c.ctx)
	c.since.Store(captureEpoch.Load() + 1)
}

// leave restores the labels of the current goroutine, once it no longer runs fn: Run's
// caller's, those of its ctx, as pprof.Do restores them; none on a goroutine of Call or Go,
// which is about to end. The label goes back to the executor when the call is unlisted,
// after this.
func (c *call) leave() {
	c.since.Store(sinceLeft)
	if c.onCaller {
		pprof.SetGoroutineLabels(c.parent)
	} else {
		pprof.SetGoroutineLabels(context.Background())
	}
}

// labelled returns the call holding the label id, if its goroutine carried it before the
// capture of the given epoch began (and so during it: a call holds its label until it
// is unlisted).
func labelled(id string, epoch uint64) *call {
	num, n, ok := parseID(id)
	if !ok {
		return nil
	}
	e := executors.find(num)
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.labels
	if t == nil || n > len(t.all) { // nil: e's drain is over, its ids are the registry's
		return nil
	}
	c := t.all[n-1].call
	if c == nil {
		return nil
	}
	if since := c.since.Load(); since == 0 || since > epoch { // sinceLeft too
		return nil
	}
	return c
}

// parseID reads "<executor number>-<n>"; a value that some other code gave the label key
// is not an id.
func parseID(id string) (num uint64, n int, ok bool) {
	a, b, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	num, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	n, err = strconv.Atoi(b)
	if err != nil || n < 1 {
		return 0, 0, false
	}
	return num, n, true
}

// executors finds an executor by its number, for the locate path alone: a Run nested in
// a call of another executor relabels that call's goroutine, and the outer call is found
// through the inner one's id. It is written once per executor, at New and when its drain
// is over, never per call, and keeps no executor alive.
var executors registry

type registry struct {
	mu   sync.Mutex
	last uint64
	m    map[uint64]weak.Pointer[Executor]
	free []*labelTable // the tables of executors whose drain is over, or collected
}

// add numbers e, with the label table of an executor whose drain is over if there is one,
// and lists it until its drain is over or it is garbage collected.
func (r *registry) add(e *Executor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var t *labelTable
	if n := len(r.free); n > 0 {
		t = r.free[n-1]
		r.free[n-1] = nil
		r.free = r.free[:n-1]
	} else {
		r.last++
		t = &labelTable{num: r.last}
	}
	if r.m == nil {
		r.m = make(map[uint64]weak.Pointer[Executor])
	}
	r.m[t.num] = weak.Make(e)
	e.labels, e.hold = t, &tableHold{t: t}
	runtime.AddCleanup(e, r.release, e.hold)
}

// release takes back the label table of h: its executor's drain is over (no call holds a
// label; the executor let go of the table under its lock, so that labelled finds none), or
// the executor was collected. Once only. The drain releases before Drain returns, so that
// the executor made next takes the table.
func (r *registry) release(h *tableHold) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h.t == nil {
		return
	}
	delete(r.m, h.t.num)
	r.free = append(r.free, h.t)
	h.t = nil
}

func (r *registry) find(num uint64) *Executor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[num].Value()
}
