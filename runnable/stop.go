package runnable

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// stopState is the stop's progress, shared by the Runnable, StopContext and the webhook server.
type stopState struct {
	delay     time.Duration
	delayName string // how errors name it: Options.name

	delayed atomic.Bool // StopContext was called
	waited  atomic.Bool // calls were pending when the stop or the drain began

	beginOnce sync.Once
	at        time.Time     // when the stop began; written before stopping is closed
	stopping  chan struct{} // closed when the stop began
}

func (s *stopState) began() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// beginStop marks the beginning of the stop, once: no campaigning for the lease from now
// on, readiness fails if there is a ShutdownDelay, and webhook responses close their connections.
func (r *Runnable) beginStop() {
	r.stop.beginOnce.Do(func() {
		if l := r.lease.Load(); l != nil {
			l.stop()
		}
		r.stop.at = time.Now()
		if r.ex.Stats().InFlight > 0 {
			r.stop.waited.Store(true)
		}
		close(r.stop.stopping)
		safely(func() {
			r.stopLog().Info("Stop began", "sinceStop", "0s",
				"shutdownDelay", r.stop.delay.String(), "gracePeriod", r.grace.String())
		})
	})
}

// sinceStop returns the key and value of the time since the stop began, for the lines of
// the stop's timeline; nothing before the stop.
func (r *Runnable) sinceStop() []any {
	if !r.stop.began() {
		return nil
	}
	return []any{"sinceStop", time.Since(r.stop.at).Round(time.Millisecond).String()}
}

// StopContext returns the context to start the manager with: mgr.Start(q.StopContext(ctx)).
// When ctx ends the stop begins (readiness fails when ShutdownDelay > 0, webhook responses
// carry "Connection: close"), and the returned context ends ShutdownDelay later, with ctx's
// cause: meanwhile the whole manager keeps serving (webhooks, probes, metrics, controllers
// with and without leader election), as kube-apiserver's --shutdown-delay-duration does.
// controller-runtime cancels a whole group of runnables at once, so only the manager's
// context can keep them all serving. A second SIGTERM still exits at once
// (ctrl.SetupSignalHandler). Call it once, before mgr.Start; with no delay it is optional.
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
			safely(func() { r.stopLog().Info("Shutdown delay over", r.sinceStop()...) })
		})
	})
	return out
}

// errLeadershipLost is the cause of the contexts that the fence ends.
var errLeadershipLost = errors.New("leader election lost")

// startDrain starts the drain once, on a goroutine of its own; r.stopped is closed when it is over.
func (r *Runnable) startDrain() {
	r.drainOnce.Do(func() {
		r.drainStarted.Store(true)
		go func() { r.finish(r.drain()) }()
	})
}

// fence ends the context of every tracked call at once: the lease was lost, another replica
// may lead already, and controller-runtime gives its runnables no grace. The stop and the
// drain begin, if they had not: no call is admitted any more, and those running stay
// tracked and reported.
func (r *Runnable) fence(lastRenewal time.Time, fenceAfter time.Duration, reason string) {
	r.beginStop()
	r.startDrain()
	<-r.ex.Draining() // every call still running is listed, and no other is admitted
	n := r.core().Fence(errLeadershipLost)
	safely(func() {
		r.log.Info("Leadership lost: cancelling calls", append(r.sinceStop(),
			"reason", reason,
			"lastRenewal", lastRenewal.UTC().Format(time.RFC3339Nano),
			"sinceLastRenewal", r.clock.Since(lastRenewal).Round(time.Millisecond).String(),
			"fenceAfter", fenceAfter.String(),
			"cancelled", n)...)
	})
}

// safely runs log and contains a panic in it: these lines are logged from quiesce's own
// goroutines, where a broken Logger must neither crash the process nor stop the stop.
func safely(log func()) {
	defer func() { _ = recover() }()
	log()
}
