package runnable

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// stopState is the stop's progress, shared by the Runnable (its readiness and drain), its
// stop procedure, StopContext and the webhook server.
type stopState struct {
	delay     time.Duration
	delayName string // how errors name it: Options.name

	delayed atomic.Bool // StopContext was called: the manager's stop comes after the delay
	waited  atomic.Bool // calls were pending when the stop or the drain began

	beginOnce sync.Once
	at        time.Time     // when the stop began; written before stopping is closed
	stopping  chan struct{} // closed when the stop began
}

// began reports whether the stop began.
func (s *stopState) began() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// beginStop marks the beginning of the stop, once: readiness fails from now on if there is
// a ShutdownDelay, and webhook responses close their connections.
func (r *Runnable) beginStop() {
	r.stop.beginOnce.Do(func() {
		if l := r.lease.Load(); l != nil {
			l.stop() // no campaigning from now on
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

// sinceStop returns the key and value giving the time since the stop began, for the lines
// of the stop's timeline; nothing before the stop.
func (r *Runnable) sinceStop() []any {
	if !r.stop.began() {
		return nil
	}
	return []any{"sinceStop", time.Since(r.stop.at).Round(time.Millisecond).String()}
}

// StopContext returns the context to start the manager with: mgr.Start(q.StopContext(ctx)).
// It ends ShutdownDelay after ctx ends, with ctx's cause. When ctx ends, the stop begins:
// ReadyzCheck fails (when ShutdownDelay > 0), a WebhookServer answers with
// "Connection: close", and the manager, which still has a live context, keeps serving
// everything for the delay: webhooks, probes, metrics, and every controller, with or
// without leader election. Then the manager's own stop procedure begins, and quiesce's drain
// with it. This is how kube-apiserver delays its own stop (--shutdown-delay-duration):
// controller-runtime cancels a whole group of runnables at once, so only the manager's
// context can keep them all serving.
//
// A second SIGTERM during the delay still exits at once (ctrl.SetupSignalHandler). With
// ShutdownDelay > 0, the Runnable refuses to start unless the manager's context
// came from StopContext; with no delay it is optional (the stop's timeline then counts
// from ctx's end). Call it once, before mgr.Start.
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

// startDrain starts the drain, once, on a goroutine of its own; r.stopped is closed when it
// is over.
func (r *Runnable) startDrain() {
	r.drainOnce.Do(func() {
		r.drainStarted.Store(true)
		go func() { r.finish(r.drain()) }()
	})
}

// fence ends the contexts of every tracked call at once: the lease was lost (the lease
// observer saw it, see ObserveLease), so another replica may lead already, and
// controller-runtime gives its runnables no grace. The stop begins, if it had not, and the
// drain with it: no call is admitted any more, and the calls still running stay tracked
// and reported.
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

// safely runs log, a call of the Logger, and contains a panic in it: these lines are logged
// from goroutines of quiesce's own, where a broken Logger must not crash the process nor
// stop the manager's stop.
func safely(log func()) {
	defer func() { _ = recover() }()
	log()
}

// added remembers the managers given to Add, so that a second Add on one manager fails,
// without keeping them alive: a map with weak keys, as the weak package describes. A weak
// pointer maps to an object, not to an address: a manager allocated where a collected one
// was gets a key of its own. The key points at the manager's first byte because Add only
// knows it as an interface; a manager that is not a pointer cannot be told apart from
// others without holding it, and is not recorded.
var added = managers{m: map[weak.Pointer[byte]]struct{}{}}

type managers struct {
	mu sync.Mutex
	m  map[weak.Pointer[byte]]struct{}
}

// claim records mgr; false if it was recorded already.
func (ms *managers) claim(mgr manager.Manager) bool {
	v := reflect.ValueOf(mgr)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return true
	}
	key := weak.Make((*byte)(v.UnsafePointer()))
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for k := range ms.m {
		if k.Value() == nil {
			delete(ms.m, k) // its manager is gone
		}
	}
	if _, ok := ms.m[key]; ok {
		return false
	}
	ms.m[key] = struct{}{}
	return true
}

// release forgets mgr, for an Add that failed before it added anything.
func (ms *managers) release(mgr manager.Manager) {
	v := reflect.ValueOf(mgr)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.m, weak.Make((*byte)(v.UnsafePointer())))
}
