package runnable

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiesce-dev/quiesce/internal"
)

// stopState is the stop's progress.
type stopState struct {
	delay     time.Duration
	delayName string // how errors name it: Options.name

	delayed atomic.Bool // StopContext was called
	waited  atomic.Bool // calls were pending when the stop or the drain began

	beginOnce sync.Once
	at        time.Time     // when the stop began; written before stopping is closed
	stopping  chan struct{} // closed when the stop began

	mu         sync.Mutex
	cut        bool                    // the lease was lost: StopContext's context ends at once
	endManager context.CancelCauseFunc // StopContext's cancel
}

// cutShort ends StopContext's context at once, now or when StopContext is called.
func (s *stopState) cutShort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut = true
	if s.endManager != nil {
		s.endManager(errLeadershipLost)
	}
}

func (s *stopState) began() bool { return internal.Closed(s.stopping) }

// beginStop marks the beginning of the stop, once: no campaigning for the lease, readiness
// failing with a ShutdownDelay, webhook connections closed (all read stop.began).
func (r *Runnable) beginStop() {
	r.stop.beginOnce.Do(func() {
		r.stop.at = time.Now()
		if r.ex.Stats().InFlight > 0 {
			r.stop.waited.Store(true)
		}
		close(r.stop.stopping)
		internal.Safely(func() {
			r.stopLog().Info("Stop began", "sinceStop", "0s",
				"shutdownDelay", r.stop.delay.String(), "gracePeriod", r.grace.String())
		})
	})
}

// sinceStop is the key and value of the time since the stop began; nothing before.
func (r *Runnable) sinceStop() []any {
	if !r.stop.began() {
		return nil
	}
	return []any{"sinceStop", time.Since(r.stop.at).Round(time.Millisecond).String()}
}

// StopContext returns the context to start the manager with: mgr.Start(q.StopContext(ctx)).
// When ctx ends the stop begins, and the returned context ends ShutdownDelay later, with
// ctx's cause: meanwhile the whole manager keeps serving, as kube-apiserver's
// --shutdown-delay-duration does (controller-runtime cancels a group of runnables at once:
// only the manager's context keeps them all). It ends at once, with the cause "leader
// election lost", when a lease of WrapLock or LeaseLost is lost: the manager stops as on
// controller-runtime's own lost lease. Call it once, before mgr.Start.
func (r *Runnable) StopContext(ctx context.Context) context.Context {
	r.stop.delayed.Store(true)
	out, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	r.stop.mu.Lock()
	r.stop.endManager = cancel
	if r.stop.cut {
		cancel(errLeadershipLost)
	}
	r.stop.mu.Unlock()
	context.AfterFunc(ctx, func() {
		r.beginStop()
		if r.stop.delay <= 0 {
			cancel(context.Cause(ctx))
			return
		}
		r.clock.AfterFunc(r.stop.delay, func() {
			if out.Err() != nil { // cut short by a lost lease
				return
			}
			defer cancel(context.Cause(ctx))
			internal.Safely(func() { r.stopLog().Info("Shutdown delay over", r.sinceStop()...) })
		})
	})
	return out
}

// errLeadershipLost is the cause of the contexts that the fence ends.
var errLeadershipLost = errors.New("leader election lost")

// startDrain starts the drain once; r.stopped is closed when it is over.
func (r *Runnable) startDrain() {
	r.drainOnce.Do(func() {
		r.drainStarted.Store(true)
		go func() { r.finish(r.drain()) }()
	})
}

// fence ends the context of every tracked call, once: the lease was lost, and another
// replica may lead already. The stop and the drain begin at once, whatever ShutdownDelay;
// the calls stay tracked and reported. Without the manager's own leader election, whose
// elector stops the manager itself, StopContext's context ends too. kv (the last renewal)
// follow reason in the log line. Concurrent callers return once the first fenced.
func (r *Runnable) fence(reason string, kv ...any) {
	r.fenceOnce.Do(func() {
		r.fenced.Store(true) // the locks write the lease no more
		r.beginStop()
		r.startDrain()
		<-r.ex.Draining() // every call still running is listed, and no other is admitted
		n := r.core().Fence(errLeadershipLost)
		if r.setup == nil || r.setup.lease == nil {
			r.stop.cutShort()
		}
		internal.Safely(func() {
			line := append(append(append(r.sinceStop(), "reason", reason), kv...), "cancelled", n)
			r.log.Info("Leadership lost: cancelling calls", line...)
		})
	})
}
