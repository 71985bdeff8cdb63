package runnable

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// stopState is the stop procedure's progress, shared with the Runnable (its readiness and
// drain) and the webhook server.
type stopState struct {
	delay time.Duration
	// timeline: log each step of the stop at the default verbosity (with a ShutdownDelay
	// or a WebhookServer); otherwise the stop stays as quiet as a plain Runnable's.
	timeline bool

	running   atomic.Bool   // the manager started the stop procedure
	at        time.Time     // when the stop began; written before stopping is closed
	stopping  chan struct{} // closed when the manager's stop began
	delayOver chan struct{} // closed when ShutdownDelay is over
}

// began reports whether the manager's stop began.
func (s *stopState) began() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// sinceStop returns the key and value giving the time since the stop began, for the lines
// of the stop's timeline; nothing for a Runnable without stop procedure, or before the stop.
func (r *Runnable) sinceStop() []any {
	if r.stop == nil || !r.stop.began() {
		return nil
	}
	return []any{"sinceStop", time.Since(r.stop.at).Round(time.Millisecond).String()}
}

// stopper is the stop procedure that Add adds to the manager. It does not need leader
// election, so it runs on every replica, and controller-runtime stops it, and waits for
// it, before it stops the leader-election runnables (the controllers and, by default, the
// Runnable): pkg/manager/internal.go, engageStopProcedure, from v0.22 through v0.25.
type stopper struct {
	r  *Runnable
	ws *webhookServer // nil without a WebhookServer
}

var _ manager.LeaderElectionRunnable = (*stopper)(nil)

func newStopper(r *Runnable, delay time.Duration, ws *webhookServer) *stopper {
	r.stop = &stopState{
		delay:     delay,
		timeline:  delay > 0 || ws != nil,
		stopping:  make(chan struct{}),
		delayOver: make(chan struct{}),
	}
	return &stopper{r: r, ws: ws}
}

// NeedLeaderElection is false: the stop procedure runs on standbys too.
func (s *stopper) NeedLeaderElection() bool { return false }

// Start blocks until ctx ends, then runs the stop procedure, one step at a time.
func (s *stopper) Start(ctx context.Context) error {
	r, st := s.r, s.r.stop
	st.running.Store(true)
	<-ctx.Done()
	log := r.log.V(1)
	if st.timeline {
		log = r.log
	}

	// Step 1: the stop began: readiness fails at once, webhook responses close their
	// connections; everything else keeps serving.
	st.at = time.Now()
	close(st.stopping)
	log.Info("Stop began", "sinceStop", "0s", "shutdownDelay", st.delay.String(), "gracePeriod", r.grace.String())

	// Step 2: keep serving for ShutdownDelay, while Services stop routing to this replica.
	// A second SIGTERM meanwhile exits the process at once (ctrl.SetupSignalHandler).
	if st.delay > 0 {
		t := time.NewTimer(st.delay)
		<-t.C
		log.Info("Shutdown delay over", r.sinceStop()...)
	}
	close(st.delayOver)

	// Step 3: stop accepting webhook connections; requests in flight are tracked calls,
	// which the drain waits for.
	if s.ws != nil {
		log.Info("Closing webhook listener", r.sinceStop()...)
		s.ws.closeListener()
	}

	// Step 4: on a standby the Runnable never started (it needs leader election): drain
	// its executor here, so that the webhook calls it tracks are waited for, reported, and
	// bounded by GracePeriod. On the leader the manager stops the Runnable next, and its
	// Start drains.
	if r.started.CompareAndSwap(false, true) {
		r.standby.Store(true)
		r.finish(r.drain())
		return r.err
	}
	return nil
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
