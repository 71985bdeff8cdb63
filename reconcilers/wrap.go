package reconcilers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// DefaultRequeueAfter is the default of WrapOptions.RequeueAfter.
const DefaultRequeueAfter = time.Second

// options are WrapOptions as a wrapped reconciler uses them.
type options struct {
	requeueAfter time.Duration
	events       *eventer // nil without WrapOptions.Recorder
	cancelAtStop bool
}

// StopPolicy is what the drain does with a controller's reconciles in flight when the stop
// begins (WrapOptions.Stop). docs/stop-policy.md helps choose.
type StopPolicy int

const (
	// FinishAtStop, the default: a reconcile in flight finishes; the drain cancels its
	// context only at CancelAfter. For work that a cut would lose or leave half-done.
	FinishAtStop StopPolicy = iota
	// CancelAtStop: the drain cancels the contexts of the controller's reconciles in
	// flight as it begins (context.Cause names this policy). They stay tracked, reported
	// and fenced; one that then returns an error is requeued quietly, as a refused request
	// is. For idempotent controllers, whose cut work the next leader redoes: the replica
	// hands the lease over without waiting for it.
	CancelAtStop
)

// WrapOptions configure Wrap and WrapTyped. The zero value is valid: every zero field means the
// documented default.
type WrapOptions struct {
	// RequeueAfter is how long after a request refused by a draining executor it is
	// requeued. 0 or negative: DefaultRequeueAfter.
	RequeueAfter time.Duration

	// Recorder, if set, receives Warning Events about the object of a reconcile that needs
	// attention (ReasonReconcileSlow, ReasonReconcileAbandoned), so that
	// `kubectl describe` shows them. nil: no Events. On controller-runtime v0.23 and later:
	// mgr.GetEventRecorder("<controller>"); on v0.22:
	// events.NewEventBroadcasterAdapter(clientset).NewRecorder("<controller>"), its
	// StartRecordingToSink called and its Shutdown deferred. A Recorder needs Reader and
	// Object, and reconcile.Request requests: Wrap panics otherwise.
	Recorder events.EventRecorder

	// Reader reads the object for its UID, which `kubectl describe` matches Events by.
	// Use the manager's cached client (mgr.GetClient()): the reads then never wait on the
	// network. Required with Recorder.
	Reader client.Reader

	// Object is an object of the reconciled type (e.g. &cachev1alpha1.Memcached{}), copied
	// for each read. Required with Recorder.
	Object client.Object

	// EventLocations: the Events name where the reconcile waits with the file and line of
	// the operator's code ("pkg.Func (file.go:123)"), as the logs do. false (the default):
	// the function alone ("pkg.Func"), as everyone who may list Events in the object's
	// namespace reads them (docs/security.md).
	EventLocations bool

	// Stop is the controller's stop policy. The zero value: FinishAtStop.
	Stop StopPolicy
}

// Wrap runs each Reconcile of r as a tracked call of ex named
// "<controller>/<namespace>/<name>" ("<controller>/<name>" for cluster-scoped objects), so
// that a drain waits for it and its reports name it, with its reconcileID.
//
// The reconcile keeps its context's values and deadline, and its panics reach
// controller-runtime (RecoverPanic, the panic metric) once the executor counted the call.
// Once a runnable.Runnable drives ex, its context ends when the drain cancels it
// (CancelAfter), not when controller-runtime begins to stop: in-flight work can finish.
//
// Once ex drains, requests are requeued after WrapOptions.RequeueAfter instead of run, with one
// V(1) log line: new ones, those whose context was cancelled before they began or while
// they waited for a MaxConcurrent slot, and those that return an error wrapping
// drain.ErrDraining. When a runnable.Runnable drives ex, a refused request is held until its
// drain is over (or its context ends) before it is requeued: once per stop.
//
// A nil ex means untracked: r runs as given, on controller-runtime's worker, with the
// context controller-runtime made, and Call inside it runs fn directly. Its first Reconcile
// logs once, through the context's logger, that the controller's reconciles are not tracked
// and what to set: a library's controllers, wrapped by their SetupWithManager, keep working
// for an importer that sets no executor.
//
// Wrap panics on a nil r, an ex that drain.New did not create, an empty controller, or a
// misconfigured WrapOptions.Recorder (see the package documentation, "Setup misuse").
func Wrap(ex *drain.Executor, controller string, r reconcile.Reconciler, opts WrapOptions) reconcile.Reconciler {
	if internal.IsNil(r) {
		panic(fmt.Sprintf("reconcilers.Wrap(%q): nil reconciler", controller))
	}
	if controller == "" {
		panic("reconcilers.Wrap: empty controller name (pass the controller's name, as given to the builder's Named)")
	}
	return WrapTyped(ex, controller, r, opts)
}

// WrapTyped is Wrap for a reconcile.TypedReconciler. The call is named
// "<controller>/<request>", the request rendered by its String method if it has one, else
// by fmt's %v. WrapOptions.Recorder needs reconcile.Request requests. A nil ex means
// untracked, as for Wrap.
func WrapTyped[R comparable](
	ex *drain.Executor, controller string, r reconcile.TypedReconciler[R], opts WrapOptions,
) reconcile.TypedReconciler[R] {
	if internal.IsNil(r) {
		panic(fmt.Sprintf("reconcilers.WrapTyped(%q): nil reconciler", controller))
	}
	if controller == "" {
		panic("reconcilers.WrapTyped: empty controller name (pass the controller's name, as given to the builder's Named)")
	}
	if opts.Stop != FinishAtStop && opts.Stop != CancelAtStop {
		panic(fmt.Sprintf("reconcilers.WrapTyped(%q): unknown WrapOptions.Stop %d (use FinishAtStop or CancelAtStop)", controller, opts.Stop))
	}
	o := options{requeueAfter: opts.RequeueAfter, cancelAtStop: opts.Stop == CancelAtStop}
	if o.requeueAfter <= 0 {
		o.requeueAfter = DefaultRequeueAfter
	}
	if !internal.IsNil(opts.Recorder) {
		o.events = newEventer[R](controller, opts) // checked without an executor too
	}
	if ex == nil {
		return &untrackedReconciler[R]{r: r, controller: controller}
	}
	if o.events != nil {
		internal.Of(ex).Settings().Observers.Add(o.events)
	}
	return &wrapped[R]{ex: internal.Of(ex), r: r, opts: o, controller: controller, name: namer[R](controller)}
}

type wrapped[R comparable] struct {
	ex         internal.Core
	r          reconcile.TypedReconciler[R]
	opts       options
	controller string
	name       func(R) (name, namespace, object string) // the call's name for a request
	refusedLog sync.Once
}

func (w *wrapped[R]) Reconcile(ctx context.Context, req R) (reconcile.Result, error) {
	if errors.Is(ctx.Err(), context.Canceled) {
		// controller-runtime cancelled it before it began: the manager is stopping.
		return w.requeue(ctx), nil
	}
	// Run, not Call: controller-runtime's worker waits for its reconcile anyway, so the
	// reconcile runs on that goroutine, tracked, with no hand-off. The request and the
	// result travel in rc, the call's handler. (A sync.Pool of handlers saved this one
	// allocation and did not move the loop's throughput: docs/performance.md.)
	var tag any
	if w.opts.events != nil {
		tag = w.opts.events.tag(any(req))
	}
	rc := &reconcileCall[R]{r: w.r, req: req}
	name, namespace, object := w.name(req)
	err := w.ex.RunHandler(ctx, internal.CallOptions{
		Name:         name,
		Namespace:    namespace,
		Object:       object,
		Controller:   w.controller,
		ReconcileID:  string(crcontroller.ReconcileIDFromContext(ctx)),
		Tag:          tag,
		Shield:       true,
		Repanic:      true,
		CancelAtStop: w.opts.cancelAtStop,
	}, rc)
	// Refused by the drain (or a handler Call it made was), cancelled by
	// controller-runtime's stop while it waited for a MaxConcurrent slot, or cut by its
	// CancelAtStop policy: requeued.
	if errors.Is(err, drain.ErrDraining) || !rc.ran && errors.Is(err, context.Canceled) || rc.stopped {
		w.hold(ctx)
		return w.requeue(ctx), nil
	}
	return rc.res, err
}

// reconcileCall is one wrapped reconcile as the executor runs it: its request in, its
// result out.
type reconcileCall[R comparable] struct {
	r   reconcile.TypedReconciler[R]
	req R
	res reconcile.Result
	ran bool
	// stopped: it failed once its CancelAtStop policy cut it (read before fn's return
	// ends ctx with another cause).
	stopped bool
}

func (c *reconcileCall[R]) Handle(ctx context.Context) error {
	c.ran = true
	var err error
	c.res, err = c.r.Reconcile(ctx, c.req)
	c.stopped = err != nil && errors.Is(context.Cause(ctx), internal.ErrCancelAtStop)
	return err
}

// hold waits, with a request the drain refused, until the drain of the Runnable that owns
// the executor is over or controller-runtime ends ctx (the controller stops), so that the
// request is requeued once per stop rather than every RequeueAfter while controllers of the
// leader-election group still run: controller-runtime's worker has nothing else to do, as
// every request is refused. Both ends are bounded: the drain by GracePeriod, ctx by the
// manager's stop. An executor that no Runnable drives is not waited for, nor one whose
// Runnable did not begin the drain (Drain called on the executor of a Runnable never
// started): nothing would end that wait but ctx, and context.Background never ends.
func (w *wrapped[R]) hold(ctx context.Context) {
	drainOver := w.ex.Settings().DrainOver
	if drainOver == nil {
		return
	}
	over := drainOver() // nil unless the Runnable began the drain: then it always closes
	if over == nil {
		return
	}
	select {
	case <-over:
	case <-ctx.Done():
	}
}

// requeue is the result of a request not run because the manager stops.
func (w *wrapped[R]) requeue(ctx context.Context) reconcile.Result {
	w.refusedLog.Do(func() {
		log.FromContext(ctx).V(1).Info("Executor is draining: requeueing requests instead of running them")
	})
	return reconcile.Result{RequeueAfter: w.opts.requeueAfter}
}

// namer returns the function naming a reconcile of controller, chosen once. A
// reconcile.Request is read without going through an interface, and its name is left to
// the executor to put together when something reads it (internal.CallOptions.FullName):
// no allocation per reconcile.
func namer[R comparable](controller string) func(R) (name, namespace, object string) {
	var zero R
	if _, ok := any(zero).(reconcile.Request); ok {
		return any(func(r reconcile.Request) (string, string, string) {
			switch {
			case r.Name == "" && r.Namespace == "": // FullName would leave the "/" out
				return controller + "/", "", ""
			case r.Name == "":
				return controller + "/" + r.Namespace + "/", "", ""
			}
			return controller, r.Namespace, r.Name
		}).(func(R) (string, string, string))
	}
	return func(req R) (string, string, string) {
		if s, ok := any(req).(fmt.Stringer); ok {
			return controller + "/" + s.String(), "", ""
		}
		return controller + "/" + fmt.Sprint(req), "", ""
	}
}

// Call runs a blocking handler call from inside a wrapped reconcile as a tracked call named
// "<reconcile name>/<name>", and waits for it like drain.Executor.Call: if ctx ends first,
// Call returns ctx.Err() and fn stays tracked, so the drain still waits for it. Calls nest.
// Once the executor drains, a Call inside a reconcile still running is admitted (the drain
// lets in-flight reconciles finish): only a Call whose reconcile has returned (from a
// goroutine that outlived it) is refused, with an error wrapping drain.ErrDraining, which
// requeues the reconcile that returns it. Before the drain, such a Call runs nothing
// either: its ctx ended with its reconcile, and it returns context.Canceled.
// Outside a tracked call it runs fn(ctx) directly, and logs that once per process, so that
// a reconciler left unwrapped is seen. An empty name or a nil fn is an error wrapping
// drain.ErrInvalidCall.
//
// A panic in fn while Call waits is raised again on the caller's goroutine with the value
// fn panicked with, once the executor counted the call, so that it reaches
// controller-runtime (RecoverPanic, its panic handlers and metric) as it would without
// quiesce, as controller-runtime's own recover raises it again. A panic after Call stopped
// waiting is logged by the executor, with fn's stack.
func Call(ctx context.Context, name string, fn func(context.Context) error) error {
	if name == "" {
		return fmt.Errorf("failed to run call: empty name: %w", drain.ErrInvalidCall)
	}
	c, ok := internal.CallOf(ctx)
	if !ok {
		untracked.Do(func() {
			log.FromContext(ctx).Info("Call outside a wrapped reconcile: running it untracked (logged once)",
				"call", internal.Cut(name),
				"howToTrack", "wrap the reconciler with reconcilers.Wrap in SetupWithManager")
		})
		if fn == nil {
			return fmt.Errorf("failed to run call %q: nil func: %w", internal.Cut(name), drain.ErrInvalidCall)
		}
		return fn(ctx)
	}
	o := internal.Nested(c, name)
	o.Repanic = true
	return c.Core().Call(ctx, o, fn)
}

// untracked logs, once per process, that a Call ran outside a tracked call: usually a
// reconciler that SetupWithManager forgot to wrap.
var untracked sync.Once

// untrackedReconciler is a reconciler wrapped without an executor: it runs as given.
type untrackedReconciler[R comparable] struct {
	r          reconcile.TypedReconciler[R]
	controller string
	logged     sync.Once
}

func (u *untrackedReconciler[R]) Reconcile(ctx context.Context, req R) (reconcile.Result, error) {
	u.logged.Do(func() {
		untracked.Do(func() {}) // this line says it for the Calls inside too
		log.FromContext(ctx).Info(
			"Reconciler wrapped without an executor: its reconciles and calls are not tracked (logged once)",
			"controller", u.controller,
			"howToTrack", "pass the executor of runnable.Add (q.Executor()) to reconcilers.Wrap")
	})
	return u.r.Reconcile(ctx, req)
}
