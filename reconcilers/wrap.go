package reconcilers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
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

// StopPolicy is what the drain does with a controller's reconciles in flight when the stop
// begins (WrapOptions.Stop). docs/stop-policy.md helps choose.
type StopPolicy int

const (
	// FinishAtStop (the default): a reconcile in flight finishes; the drain cancels its
	// context only at CancelAfter. For work that a cut would lose or leave half-done.
	FinishAtStop StopPolicy = iota
	// CancelAtStop makes the drain cancel the contexts of reconciles in flight as it begins
	// (context.Cause names this policy); they stay tracked. For idempotent controllers,
	// whose cut work the next leader redoes: the lease is handed over without waiting.
	CancelAtStop
	// HandOffAtStop hands the leader lease over at once and lets the reconciles in flight
	// finish, as FinishAtStop does, each fenced by a claim on its object: a Lease in the
	// operator's lease namespace, held while the work runs, that the successor honours.
	// The claim lasts the manager's LeaseDuration + Cleanup, longer than the RenewDeadline +
	// Cleanup after its last renewal within which the work's context ends if renewals fail.
	// The leader's first reconcile lists the claims (one LIST, no cache); a reconcile of an
	// object that list found claimed by another replica reads the claim again (one GET) and,
	// while it is unexpired by this replica's clock, requeues the request without running it.
	// Any other reconcile costs no request.
	// It needs reconcile.Request requests and a Runnable of runnable.Setup with the
	// manager's leader election on: Wrap panics otherwise. docs/design.md, "Handing over".
	HandOffAtStop
)

// WrapOptions configure Wrap and WrapTyped. Zero fields mean the documented defaults.
type WrapOptions struct {
	// RequeueAfter: when a refused request is requeued. 0 or negative: DefaultRequeueAfter.
	RequeueAfter time.Duration

	// Recorder, if set, receives Warning Events (ReasonReconcileSlow,
	// ReasonReconcileAbandoned; under HandOffAtStop ReasonClaimNotRenewed, and the Normal
	// ReasonClaimWaited) on the reconciled object. On controller-runtime v0.23+:
	// mgr.GetEventRecorder("<controller>"); on v0.22:
	// events.NewEventBroadcasterAdapter(clientset).NewRecorder("<controller>"). It needs
	// Reader, Object and reconcile.Request requests: Wrap panics otherwise.
	Recorder events.EventRecorder

	// Reader reads the object for its UID (kubectl describe matches Events by it): the
	// manager's cached client, mgr.GetClient(). Required with Recorder.
	Reader client.Reader

	// Object, of the reconciled type, is copied for each read. Required with Recorder.
	Object client.Object

	// EventLocations: Events show file and line ("pkg.Func (file.go:123)"), as logs do.
	// false: the function alone, as whoever lists Events reads them (docs/security.md).
	EventLocations bool

	// Stop is the controller's stop policy. The zero value: FinishAtStop.
	Stop StopPolicy

	// Cleanup is the controller's cleanup window: the time kept between the cancel of a
	// reconcile's context and the abandon at the end of the grace period, for the work a
	// cancelled reconcile still does (Helm's atomic rollback). The drain cancels such a
	// reconcile, and the Calls inside it, at min(CancelAfter, GracePeriod - Cleanup) from
	// its start. 0: at CancelAfter. Wrap panics on a negative value, or one not below the
	// GracePeriod of the Runnable that owns ex. docs/stop-policy.md, "Long work".
	Cleanup time.Duration

	// OnAbandon, if set, is called for each reconcile of the controller still running at
	// the end of the grace period, so that the operator records what it leaves half-done
	// (a Helm operator marks the release failed). It runs while the abandoned reconcile
	// may still run, concurrently with the other hooks and the Events, before the
	// Runnable's Start returns. ctx ends with the budget of the Events of abandoned calls
	// (at most 5s) and when the lease is lost; it carries quiesce's logger. A panic in it is
	// logged. It is never called once the lease is lost (the skip is logged). It needs
	// reconcile.Request requests: Wrap panics otherwise.
	OnAbandon func(ctx context.Context, req reconcile.Request)
}

// Wrap runs each Reconcile of r as a tracked call of ex named
// "<controller>/<namespace>/<name>" ("<controller>/<name>" if cluster-scoped), with its
// reconcileID. It keeps its context's values and deadline; its panics reach
// controller-runtime once counted. Once a runnable.Runnable drives ex, its context ends
// when the drain cancels it (see WrapOptions.Stop), not when controller-runtime stops.
//
// Once ex drains, requests are requeued after RequeueAfter instead of run (one V(1) line):
// new ones, those cancelled before they began or while waiting for a slot, those that
// return an error wrapping drain.ErrDraining, and CancelAtStop ones cut by the drain. Under
// a Runnable, a refused request is held until its drain is over: requeued once per stop.
//
// A nil ex means untracked: r runs as given and Call inside it runs fn directly; the first
// Reconcile logs so once. Wrap panics on misuse (package doc, "Setup misuse").
func Wrap(ex *drain.Executor, controller string, r reconcile.Reconciler, opts WrapOptions) reconcile.Reconciler {
	return wrap("Wrap", ex, controller, r, opts)
}

// WrapTyped is Wrap for a reconcile.TypedReconciler, the call named "<controller>/<request>"
// (the request as %v formats it: String if it has one).
func WrapTyped[R comparable](
	ex *drain.Executor, controller string, r reconcile.TypedReconciler[R], opts WrapOptions,
) reconcile.TypedReconciler[R] {
	return wrap("WrapTyped", ex, controller, r, opts)
}

// wrap is Wrap and WrapTyped; fn names the one called in its panics.
func wrap[R comparable](
	fn string, ex *drain.Executor, controller string, r reconcile.TypedReconciler[R], opts WrapOptions,
) reconcile.TypedReconciler[R] {
	var zero R
	_, byRequest := any(zero).(reconcile.Request)
	recorder := !internal.IsNil(opts.Recorder)
	switch {
	case internal.IsNil(r):
		panic(fmt.Sprintf("reconcilers.%s(%q): nil reconciler", fn, controller))
	case controller == "":
		panic("reconcilers." + fn + ": empty controller name (pass the controller's name, as given to the builder's Named)")
	case opts.Stop != FinishAtStop && opts.Stop != CancelAtStop && opts.Stop != HandOffAtStop:
		panic(fmt.Sprintf("reconcilers.%s(%q): unknown WrapOptions.Stop %d (use FinishAtStop, CancelAtStop or HandOffAtStop)",
			fn, controller, opts.Stop))
	case opts.Stop == HandOffAtStop && !byRequest:
		panic(fmt.Sprintf("reconcilers.%s(%q): HandOffAtStop needs reconcile.Request requests, not %T",
			fn, controller, zero))
	case opts.Stop == HandOffAtStop && (ex == nil || internal.Of(ex).Settings().Claims == nil):
		panic(fmt.Sprintf("reconcilers.%s(%q): HandOffAtStop needs the executor of runnable.Setup with the manager's "+
			"leader election on and a lease namespace (LeaderElectionNamespace): use FinishAtStop without them",
			fn, controller))
	case recorder && !byRequest:
		panic(fmt.Sprintf("reconcilers.%s(%q): WrapOptions.Recorder needs reconcile.Request requests, not %T",
			fn, controller, zero))
	case recorder && (internal.IsNil(opts.Reader) || internal.IsNil(opts.Object)):
		panic(fmt.Sprintf("reconcilers.%s(%q): WrapOptions.Recorder needs WrapOptions.Reader and WrapOptions.Object "+
			"(Reader nil: %t, Object nil: %t)", fn, controller, internal.IsNil(opts.Reader), internal.IsNil(opts.Object)))
	case opts.OnAbandon != nil && !byRequest:
		panic(fmt.Sprintf("reconcilers.%s(%q): WrapOptions.OnAbandon needs reconcile.Request requests, not %T",
			fn, controller, zero))
	case opts.Cleanup < 0:
		panic(fmt.Sprintf("reconcilers.%s(%q): WrapOptions.Cleanup is %v: set it to 0 (none) or more",
			fn, controller, opts.Cleanup))
	}
	if grace := graceOf(ex); grace > 0 && opts.Cleanup >= grace {
		panic(fmt.Sprintf("reconcilers.%s(%q): WrapOptions.Cleanup (%v) must be below the Runnable's GracePeriod (%v): "+
			"lower Cleanup, or raise GracePeriod", fn, controller, opts.Cleanup, grace))
	}
	w := &wrapped[R]{r: r, name: namer[R](controller), requeueAfter: opts.RequeueAfter,
		call: internal.CallOptions{Controller: controller, Shield: true, Repanic: true,
			CancelAtStop: opts.Stop == CancelAtStop}}
	if w.requeueAfter <= 0 {
		w.requeueAfter = DefaultRequeueAfter
	}
	if recorder {
		w.events = &eventer{WrapOptions: opts, controller: controller}
	}
	if ex != nil {
		w.ex = internal.Of(ex)
		if w.events != nil {
			w.ex.Settings().Observers.Add(w.events)
		}
		if opts.Cleanup > 0 {
			w.ex.Settings().Cleanups.Store(controller, opts.Cleanup)
		}
		if opts.Stop == HandOffAtStop {
			w.claims = w.ex.Settings().Claims
		}
		if opts.OnAbandon != nil {
			w.abandon = &abandoner{controller: controller, fn: opts.OnAbandon, fenced: w.ex.Fenced()}
			w.ex.Settings().Observers.Add(w.abandon)
		}
	}
	return w
}

// graceOf returns the GracePeriod of the Runnable that owns ex; 0 if none does.
func graceOf(ex *drain.Executor) time.Duration {
	if ex == nil {
		return 0
	}
	return internal.Of(ex).Settings().Grace
}

type wrapped[R comparable] struct {
	ex           internal.Core // nil: untracked
	r            reconcile.TypedReconciler[R]
	name         func(R) (name, namespace, object string) // the call's name for a request
	call         internal.CallOptions                     // what every reconcile's call shares
	requeueAfter time.Duration
	events       *eventer        // nil without WrapOptions.Recorder
	abandon      *abandoner      // nil without WrapOptions.OnAbandon
	claims       internal.Claims // HandOffAtStop's; nil for the other policies
	refusedLog   sync.Once
	untracked    sync.Once
}

func (w *wrapped[R]) Reconcile(ctx context.Context, req R) (reconcile.Result, error) {
	if w.ex == nil {
		w.untracked.Do(func() {
			untracked.Do(func() {}) // this line says it for the Calls inside too
			log.FromContext(ctx).Info(
				"Reconciler wrapped without an executor: its reconciles and calls are not tracked (logged once)",
				"controller", w.call.Controller,
				"howToTrack", "pass the executor of runnable.Setup (q.Executor()) to reconcilers.Wrap")
		})
		return w.r.Reconcile(ctx, req)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return w.requeue(ctx), nil
	}
	o := w.call
	o.Name, o.Namespace, o.Object = w.name(req)
	o.ReconcileID = string(crcontroller.ReconcileIDFromContext(ctx))
	if w.events != nil || w.abandon != nil { // Recorder and OnAbandon made sure R is reconcile.Request
		r, _ := any(req).(reconcile.Request)
		o.Tag = &eventTag{ev: w.events, ab: w.abandon, key: r.NamespacedName}
	}
	// Run on the worker's goroutine; request and result travel in rc (docs/performance.md).
	rc := &reconcileCall[R]{r: w.r, req: req}
	if w.claims != nil {
		wait, err := w.claims.Wait(ctx, o.Controller, o.Namespace, o.Object)
		if err != nil {
			return reconcile.Result{}, err
		}
		if wait.Left > 0 {
			if wait.First && w.events != nil {
				w.events.waiting(ctx, types.NamespacedName{Namespace: o.Namespace, Name: o.Object}, wait)
			}
			return w.claimed(ctx, wait.Left), nil
		}
		// Registered before admission: the stop claims every reconcile the drain admitted.
		rc.claim = w.claims.Begin(o.Controller, o.Namespace, o.Object, o.ReconcileID)
		defer rc.claim.End()
		if w.events != nil {
			key, id := types.NamespacedName{Namespace: o.Namespace, Name: o.Object}, o.ReconcileID
			rc.onFence = func(ctx context.Context) { w.events.fenced(ctx, key, id) }
		}
	}
	err := w.ex.RunHandler(ctx, o, rc)
	if errors.Is(err, drain.ErrDraining) || !rc.ran && errors.Is(err, context.Canceled) || rc.stopped {
		return w.requeue(ctx), nil
	}
	return rc.res, err
}

// reconcileCall is one wrapped reconcile as the executor runs it.
type reconcileCall[R comparable] struct {
	r       reconcile.TypedReconciler[R]
	req     R
	res     reconcile.Result
	ran     bool
	stopped bool                  // it failed once CancelAtStop cut it
	claim   internal.Claimed      // HandOffAtStop's; nil for the other policies
	onFence func(context.Context) // records ReasonClaimNotRenewed; nil without WrapOptions.Recorder
}

func (c *reconcileCall[R]) Handle(ctx context.Context) error {
	c.ran = true
	if c.claim != nil {
		var cancel context.CancelFunc
		var onFence func()
		if c.onFence != nil {
			parent := context.WithoutCancel(ctx) // the Event is recorded once the work's context ended
			onFence = func() {
				// Bounded: End waits for it, and the drain for End.
				ctx, cancel := context.WithTimeout(parent, fenceEventTimeout)
				defer cancel()
				c.onFence(ctx)
			}
		}
		ctx, cancel = c.claim.Bind(ctx, onFence)
		defer c.claim.End() // released before the call returns: the drain waits for it
		defer cancel()
	}
	var err error
	c.res, err = c.r.Reconcile(ctx, c.req)
	c.stopped = err != nil && errors.Is(context.Cause(ctx), internal.ErrCancelAtStop)
	return err
}

// requeue answers a refused request. Under a Runnable whose drain began, it first waits
// until the drain is over or ctx ends (internal.Settings.DrainOver): once per stop.
func (w *wrapped[R]) requeue(ctx context.Context) reconcile.Result {
	if drainOver := w.ex.Settings().DrainOver; drainOver != nil {
		if over := drainOver(); over != nil {
			select {
			case <-over:
			case <-ctx.Done():
			}
		}
	}
	w.refusedLog.Do(func() {
		log.FromContext(ctx).V(1).Info("Executor is draining: requeueing requests instead of running them")
	})
	return reconcile.Result{RequeueAfter: w.requeueAfter}
}

// claimed answers a request whose object another replica claims: requeued after the time
// its claim has left, at most MaxClaimRecheck, so that a released claim is seen soon.
func (w *wrapped[R]) claimed(ctx context.Context, wait time.Duration) reconcile.Result {
	log.FromContext(ctx).V(1).Info("Object claimed by another replica: requeueing the request",
		"claimLeft", wait.Round(time.Millisecond).String())
	return reconcile.Result{RequeueAfter: min(wait, MaxClaimRecheck)}
}

// MaxClaimRecheck bounds the RequeueAfter of a request whose object another replica claims
// (HandOffAtStop): the successor reads the claim again at least this often.
const MaxClaimRecheck = 2 * time.Second

// fenceEventTimeout bounds the read of the object (the manager's cache) that the Event of a
// reconcile fenced by its claim needs (WrapOptions.Recorder).
const fenceEventTimeout = 5 * time.Second

// namer returns the function naming a reconcile, chosen once; a reconcile.Request's name
// is put together only when read (CallOptions.FullName): no allocation per reconcile.
func namer[R comparable](controller string) func(R) (name, namespace, object string) {
	var zero R
	if _, ok := any(zero).(reconcile.Request); ok {
		return any(func(r reconcile.Request) (string, string, string) {
			switch {
			case r.Name == "" && r.Namespace == "": // FullName would drop the "/"
				return controller + "/", "", ""
			case r.Name == "":
				return controller + "/" + r.Namespace + "/", "", ""
			}
			return controller, r.Namespace, r.Name
		}).(func(R) (string, string, string))
	}
	return func(req R) (string, string, string) {
		return controller + "/" + fmt.Sprint(req), "", ""
	}
}

// Call runs a blocking handler from inside a wrapped reconcile as a tracked call named
// "<reconcile name>/<name>", and waits for it as drain.Executor.Call does: if ctx ends
// first, it returns ctx.Err() and fn stays tracked. Calls nest. Once the executor drains, a
// Call inside a reconcile still running is admitted; one whose reconcile returned (from a
// goroutine that outlived it) is refused with an error wrapping drain.ErrDraining (before
// the drain it returns context.Canceled: its ctx ended with its reconcile). Outside a
// tracked call it runs fn(ctx) directly, logged once per process. An empty name or a nil
// fn: drain.ErrInvalidCall. A panic in fn while Call waits is raised again on the caller's
// goroutine with fn's value, so controller-runtime sees it; a later one is logged.
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

// untracked logs, once per process, a Call outside a tracked call (an unwrapped reconciler).
var untracked sync.Once
