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
// only the manager's context keeps them all). Call it once, before mgr.Start.
func (r *Runnable) StopContext(ctx context.Context) context.Context {
	r.stop.delayed.Store(true)
	out, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	context.AfterFunc(ctx, func() {
		r.beginStop()
		if r.stop.delay <= 0 {
			cancel(context.Cause(ctx))
			return
		}
		r.clock.AfterFunc(r.stop.delay, func() {
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

// fence ends the context of every tracked call: the lease was lost, and another replica may
// lead already. The stop and the drain begin; the calls stay tracked and reported.
func (r *Runnable) fence(lastRenewal time.Time, fenceAfter time.Duration, reason string) {
	r.beginStop()
	r.startDrain()
	<-r.ex.Draining() // every call still running is listed, and no other is admitted
	n := r.core().Fence(errLeadershipLost)
	internal.Safely(func() {
		r.log.Info("Leadership lost: cancelling calls", append(r.sinceStop(),
			"reason", reason,
			"lastRenewal", lastRenewal.UTC().Format(time.RFC3339Nano),
			"sinceLastRenewal", r.clock.Since(lastRenewal).Round(time.Millisecond).String(),
			"fenceAfter", fenceAfter.String(),
			"cancelled", n)...)
	})
}
