package runnable

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// Options configure a Runnable. The zero value is valid: every zero field means the
// documented default.
type Options struct {
	// Options configure the executor the Runnable owns (see drain.Options for their
	// defaults). With no Logger, Add uses the manager's logger named "quiesce"; New
	// discards the log.
	drain.Options

	// GracePeriod bounds how long Start waits, once its context ended, for the tracked
	// calls to return. 0 or negative: 25s, below the manager's default
	// GracefulShutdownTimeout of 30s, so that the Runnable names what it abandons before
	// the manager gives up on it. Keep it below GracefulShutdownTimeout (see the README,
	// "Deploying"). It is measured on real time (the time package), not on Options.Clock.
	GracePeriod time.Duration

	// NeedLeaderElection is what NeedLeaderElection returns. nil: true (see
	// Runnable.NeedLeaderElection for why).
	NeedLeaderElection *bool
}

// DefaultGracePeriod is the GracePeriod used when Options leave it zero.
const DefaultGracePeriod = 25 * time.Second

// Runnable is a manager.Runnable that owns a drain.Executor and drains it when the manager
// stops. Create it with New or Add; all its methods are safe for concurrent use.
type Runnable struct {
	ex      *drain.Executor
	log     logr.Logger
	grace   time.Duration
	elected bool
	metered bool // added by Add: its drain is in the metrics

	started atomic.Bool
	stopped chan struct{} // closed when Start returned
	err     error         // what Start returned; written before stopped is closed
}

var (
	_ manager.Runnable               = (*Runnable)(nil)
	_ manager.LeaderElectionRunnable = (*Runnable)(nil)
)

// New returns a Runnable owning a new executor configured by opts.Options. It is not added
// to a manager: Add does that, with its readyz check and metrics.
func New(opts Options) *Runnable {
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	elected := true
	if opts.NeedLeaderElection != nil {
		elected = *opts.NeedLeaderElection
	}
	ex := drain.New(opts.Options)
	// Fixed here, before the executor is shared: a reconcile gets the same context policy
	// whether it starts before or after the manager starts the Runnable.
	internal.SettingsOf(ex).Driven = true
	r := &Runnable{
		ex:      ex,
		log:     opts.Logger,
		grace:   opts.GracePeriod,
		elected: elected,
		stopped: make(chan struct{}),
	}
	return r
}

// Add creates a Runnable with New and adds it to mgr, with ReadyzCheck as the readyz check
// "quiesce" and the executor's metrics in controller-runtime's metrics.Registry. It must be
// called before mgr.Start.
func Add(mgr manager.Manager, opts Options) (*Runnable, error) {
	if mgr == nil {
		return nil, errors.New("failed to add quiesce runnable: nil manager")
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = mgr.GetLogger().WithName("quiesce")
	}
	r := New(opts)
	internal.SettingsOf(r.ex).AfterCall = observeCall
	r.metered = true // before mgr.Add, which may start r at once
	if err := mgr.Add(r); err != nil {
		return nil, fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if err := mgr.AddReadyzCheck("quiesce", r.ReadyzCheck); err != nil {
		return nil, fmt.Errorf("failed to add quiesce readyz check: %w", err)
	}
	registerStats(r.ex)
	return r, nil
}

// Executor returns the executor the Runnable owns and drains. Pass it to reconcilers.Wrap.
func (r *Runnable) Executor() *drain.Executor { return r.ex }

// NeedLeaderElection reports whether the manager starts the Runnable only once elected.
//
// It is true by default, and should stay so where the controllers need leader election:
// controller-runtime stops the runnables that do not need leader election first, while
// the controllers still dequeue and reconcile, so an executor in that group would drain
// (and refuse work) while the controllers feeding it still run. In the leader-election
// group, the executor stops together with the controllers that feed it, and the
// controllers' wait for their reconciles and the executor's drain share one grace period.
func (r *Runnable) NeedLeaderElection() bool { return r.elected }

// ReadyzCheck is a healthz.Checker that fails from the moment the executor drains, so that
// a Service stops sending work to a pod that is shutting down.
func (r *Runnable) ReadyzCheck(*http.Request) error {
	select {
	case <-r.ex.Draining():
		return errors.New("quiesce executor is draining")
	default:
		return nil
	}
}

// Start marks the executor as driven and blocks until ctx ends. Then it drains the
// executor: it refuses new calls and waits up to GracePeriod for the tracked ones to
// return, while the executor logs what it still waits for. It returns nil when every call
// returned, or the *drain.PendingError naming the calls it abandoned, after logging them
// as one error line. A Runnable starts once: a second Start, or a Start after its
// executor drained, returns an error at once.
func (r *Runnable) Start(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("failed to start quiesce runnable: already started")
	}
	select {
	case <-r.ex.Draining():
		r.finish(errors.New("failed to start quiesce runnable: its executor already drained"))
		return r.err
	default:
	}
	<-ctx.Done()
	r.finish(r.drain())
	return r.err
}

// drain is the stop procedure, one step at a time.
func (r *Runnable) drain() error {
	pending := r.ex.Stats().InFlight
	log := r.log.WithValues("gracePeriod", r.grace.String())
	// Say nothing at the default verbosity when nothing is pending, as the reports do.
	info := log.V(1)
	if pending > 0 {
		info = log
	}

	// Step 1: refuse new calls and wait for the tracked ones, within the grace period.
	// Reports of pending calls come from the executor while it waits.
	info.Info("Draining executor", "pending", pending)
	ctx, cancel := context.WithTimeout(context.Background(), r.grace)
	defer cancel()
	start := time.Now()
	err := r.ex.Drain(ctx)
	if r.metered {
		drainSeconds.Observe(time.Since(start).Seconds())
	}

	// Step 2: every call returned: done.
	if err == nil {
		info.Info("All calls returned")
		return nil
	}

	// Step 3: the grace period ran out: name every call abandoned, in one line, since
	// controller-runtime logs a runnable's error only in its own generic terms.
	var pe *drain.PendingError
	if errors.As(err, &pe) {
		names := make([]string, len(pe.Pending))
		for i, p := range pe.Pending {
			names[i] = p.Name
			if p.Where != "" {
				names[i] += " at " + p.Where
			}
		}
		log.Error(err, "Abandoned calls still running after the grace period", "abandoned", len(names), "calls", names)
	} else {
		log.Error(err, "Failed to drain executor")
	}
	return err
}

func (r *Runnable) finish(err error) {
	r.err = err
	close(r.stopped)
}

// Done returns a channel closed when Start returned.
func (r *Runnable) Done() <-chan struct{} { return r.stopped }

// Err returns what Start returned, once Done is closed: nil when every call returned, or
// the *drain.PendingError naming the abandoned calls. Before that it returns nil.
//
// controller-runtime does not return a runnable's error from mgr.Start once the manager
// is stopping, so main uses Err to learn that calls were abandoned, e.g. to exit non-zero:
//
//	if err := mgr.Start(ctx); err != nil { ... }
//	if err := q.Err(); err != nil { os.Exit(1) }
func (r *Runnable) Err() error {
	select {
	case <-r.stopped:
		return r.err
	default:
		return nil
	}
}
