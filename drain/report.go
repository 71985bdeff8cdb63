package drain

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/quiesce-dev/quiesce/internal"
)

// entries renders calls for a log line as of now, names and locations cut.
func entries(calls []Pending, now time.Time) internal.Entries {
	out := make(internal.Entries, len(calls))
	for i, p := range calls {
		out[i] = internal.Entry{
			Name:        internal.Cut(p.Name),
			Age:         internal.Age(now.Sub(p.Started)),
			Detached:    p.Detached,
			Daemon:      p.Daemon,
			ReconcileID: p.ReconcileID,
			Where:       internal.Cut(p.Where),
			Handler:     internal.Cut(p.Handler),
		}
		if p.cleanup > 0 {
			out[i].Cleanup = p.cleanup.String()
		}
	}
	return out
}

// reportDue re-arms the next report (no drift) and logs this one, while a Drain waits.
func (e *Executor) reportDue() {
	e.mu.Lock()
	if e.waiters == 0 || e.inFlight == 0 || e.report == nil {
		e.mu.Unlock()
		return
	}
	e.armReport(e.opts.ReportEvery)
	e.mu.Unlock()
	if e.logging.CompareAndSwap(false, true) { // else the previous line is still logged: nothing piles up
		go func() {
			defer e.logging.Store(false)
			internal.Safely(e.reportPending)
		}()
	}
}

// reportPending logs the pending calls, unless the last Drain stopped waiting meanwhile.
func (e *Executor) reportPending() {
	calls, total := e.Locate(internal.MaxListed)
	if total == 0 {
		return
	}
	kv := internal.More(e.stopKV("pending", total, "calls", entries(calls, e.opts.Clock.Now())), total, len(calls))
	e.mu.Lock()
	if e.waiters == 0 || e.inFlight == 0 {
		e.mu.Unlock()
		return
	}
	lineDone := make(chan struct{})
	e.lineDone = lineDone
	e.mu.Unlock()
	defer close(lineDone)
	e.opts.Logger.Info("Waiting for pending calls", kv...)
}

// maxSlowBackoff bounds the wait between two "Slow calls" lines about the same set.
const maxSlowBackoff = time.Hour

// armSlow arms the slow-call timer to fire in d. The caller holds e.mu.
func (e *Executor) armSlow(d time.Duration) {
	if e.opts.SlowAfter < 0 || e.isDraining {
		return
	}
	stopTimer(e.slowTimer) // a new timer each time, as armReport
	e.slowTimer = e.opts.Clock.AfterFunc(d, func() { go e.checkSlow() })
}

// slowCalls returns the oldest limit calls slow at now, daemons aside, their count, the
// newest, and how long until the next call turns slow (0: none). The caller holds e.mu.
func (e *Executor) slowCalls(now time.Time, limit int) (calls []*call, count int, newest *call, next time.Duration) {
	if e.opts.SlowAfter < 0 {
		return nil, 0, nil, 0
	}
	for c := e.calls.next; c != &e.calls; c = c.next {
		if c.opts.Daemon {
			continue
		}
		if next = c.start.Add(e.opts.SlowAfter).Sub(now); next > 0 {
			break // the list is in admission order
		}
		count++
		newest = c
		if len(calls) < limit {
			calls = append(calls, c)
		}
	}
	return calls, count, newest, max(next, 0)
}

// checkSlow logs the slow calls if due, and re-arms the timer while calls run.
func (e *Executor) checkSlow() {
	obs := e.settings.Observers.List()
	limit := internal.MaxListed
	if len(obs) > 0 {
		limit = internal.MaxObserved // the observers (Events) are told of more calls, from one capture
	}
	e.mu.Lock()
	e.slowTimer = nil
	if e.isDraining || e.inFlight == 0 {
		e.mu.Unlock()
		return
	}
	now := e.opts.Clock.Now()
	slow, count, newest, next := e.slowCalls(now, limit)
	switch {
	case count > 0:
		e.armSlow(e.opts.ReportEvery)
	case next > 0:
		e.armSlow(next)
	}
	s := &e.slow
	due := count > 0 && now.Sub(s.logged) >= s.backoff
	if count != s.count || newest != s.newest { // a new set: a prefix of the list, daemons aside
		s.count, s.newest, s.backoff = count, newest, e.opts.ReportEvery
		due = count > 0
	} else if due {
		s.backoff = min(2*s.backoff, maxSlowBackoff)
	}
	if due {
		s.logged = now
	}
	e.mu.Unlock()
	if !due || !e.logging.CompareAndSwap(false, true) {
		return
	}
	defer e.logging.Store(false)
	ents := entries(e.locate(slow, false), now)
	listed := ents[:min(len(ents), internal.MaxListed)]
	kv := internal.More([]any{"slow", count, "slowAfter", e.opts.SlowAfter.String(), "calls", listed}, count, len(listed))
	internal.Safely(func() { e.opts.Logger.Info("Slow calls", kv...) })
	if len(obs) == 0 {
		return
	}
	o := observed(slow, ents)
	ctx, cancel := context.WithTimeout(logr.NewContext(context.Background(), e.opts.Logger), observeTimeout)
	defer cancel()
	for _, ob := range obs {
		internal.Safely(func() { ob.Slow(ctx, o) })
	}
}

// observed pairs the located calls with their entries, for internal.Observer. calls are of
// one executor; their options are read under its lock (Rename).
func observed(calls []*call, ents []internal.Entry) []internal.Observed {
	out := make([]internal.Observed, len(calls))
	if len(calls) == 0 {
		return out
	}
	calls[0].e.mu.Lock()
	defer calls[0].e.mu.Unlock()
	for i, c := range calls {
		out[i] = internal.Observed{Entry: ents[i], Options: c.Options()}
	}
	return out
}

// observeTimeout bounds the observers (Events read objects) per "Slow calls" line.
const observeTimeout = 5 * time.Second

func (c *core) Abandoned(ctx context.Context) {
	e := (*Executor)(c)
	obs := e.settings.Observers.List()
	if len(obs) == 0 {
		return
	}
	ctx = logr.NewContext(ctx, e.opts.Logger)
	calls, _ := e.list(-1)
	o := observed(calls, entries(e.locate(calls, false), e.opts.Clock.Now()))
	var wg sync.WaitGroup
	for _, ob := range obs {
		wg.Go(func() { internal.Safely(func() { ob.Abandoned(ctx, o) }) })
	}
	wg.Wait()
}
