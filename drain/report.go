package drain

import (
	"time"

	"k8s.io/utils/clock"

	"github.com/quiesce-dev/quiesce/internal"
)

// reportEntry is one call in the "calls" list of a report.
type reportEntry struct {
	Name     string `json:"name"`
	Age      string `json:"age"`
	Detached bool   `json:"detached"`
	Where    string `json:"where"`
	Handler  string `json:"handler"`
}

// entries renders located calls for a log line, as of now.
func entries(calls []Pending, now time.Time) []reportEntry {
	out := make([]reportEntry, len(calls))
	for i, p := range calls {
		out[i] = reportEntry{
			Name:     p.Name,
			Age:      internal.Age(now.Sub(p.Started)),
			Detached: p.Detached,
			Where:    p.Where,
			Handler:  p.Handler,
		}
	}
	return out
}

// reportPending logs one line about the pending calls, if any, during a drain.
func (e *Executor) reportPending() {
	calls, total := e.Locate(maxListed)
	if total == 0 {
		return
	}
	kv := []any{"pending", total, "calls", entries(calls, e.clock.Now())}
	if more := total - len(calls); more > 0 {
		kv = append(kv, "more", more)
	}
	e.log.Info("Waiting for pending calls", kv...)
}

// logAsync runs log, which calls the Logger, on a goroutine of its own, unless the
// previous one has not returned yet: a Logger that blocks delays nothing and piles up
// nothing, and one that panics crashes nothing.
func (e *Executor) logAsync(log func()) {
	if !e.logging.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer e.logging.Store(false)
		e.safely(log)
	}()
}

// Slow calls are watched by one timer per executor, armed while calls are in flight and
// outside a drain, so that a call costs no timer of its own and an idle executor leaves
// no goroutine behind. The timer fires when the oldest call turns slow, then every
// ReportEvery while some call is slow.

// armSlow arms the slow-call timer to fire in d. The caller holds e.mu.
func (e *Executor) armSlow(d time.Duration) {
	if e.opts.SlowAfter < 0 || e.isDraining {
		return
	}
	if e.slowTimer != nil {
		e.slowTimer.Reset(d)
		e.slowArmed = true
		return
	}
	clk, ok := e.clock.(clock.WithDelayedExecution)
	if !ok {
		return
	}
	// A fake clock calls the func with its lock held: check on a goroutine of its own.
	e.slowTimer = clk.AfterFunc(d, func() { go e.checkSlow() })
	e.slowArmed = true
}

// countSlow counts the calls that have run for SlowAfter or longer at now: a prefix of the
// list, oldest first. The caller holds e.mu.
func (e *Executor) countSlow(now time.Time) int64 {
	if e.opts.SlowAfter < 0 {
		return 0
	}
	var n int64
	for c := e.oldest; c != nil && now.Sub(c.start) >= e.opts.SlowAfter; c = c.next {
		n++
	}
	return n
}

// checkSlow logs the slow calls, if any, and re-arms the timer while calls are in flight.
func (e *Executor) checkSlow() {
	e.mu.Lock()
	e.slowArmed = false
	if e.isDraining || e.oldest == nil {
		e.mu.Unlock()
		return
	}
	now := e.now()
	total := int(e.countSlow(now))
	slow := make([]*call, 0, min(total, maxListed))
	for c := e.oldest; len(slow) < cap(slow); c = c.next {
		slow = append(slow, c)
	}
	if total > 0 {
		e.armSlow(e.opts.ReportEvery)
	} else {
		e.armSlow(e.oldest.start.Add(e.opts.SlowAfter).Sub(now))
	}
	e.mu.Unlock()
	if total == 0 || !e.logging.CompareAndSwap(false, true) {
		return
	}
	defer e.logging.Store(false)
	calls := e.locate(slow)
	kv := []any{"slow", total, "slowAfter", e.opts.SlowAfter.String(), "calls", entries(calls, now)}
	if more := total - len(calls); more > 0 {
		kv = append(kv, "more", more)
	}
	e.safely(func() { e.log.Info("Slow calls", kv...) })
}
