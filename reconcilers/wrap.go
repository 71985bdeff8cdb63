package reconcilers

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// Option configures Wrap and WrapTyped.
type Option func(*options)

type options struct {
	requeueAfter time.Duration
}

// DefaultRequeueAfter is how long after a refused request Wrap asks for it again by default.
const DefaultRequeueAfter = time.Second

// WithRequeueAfter sets how long after a request refused by a draining executor it is
// requeued. Default: DefaultRequeueAfter. Values <= 0 mean the default.
func WithRequeueAfter(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.requeueAfter = d
		}
	}
}

// Wrap runs each Reconcile of r as a tracked call of ex named "<controller>/<namespace>/<name>"
// ("<controller>/<name>" for cluster-scoped objects), on controller-runtime's worker
// goroutine. Inside it, Call runs blocking handler calls as tracked calls too.
//
// The reconcile keeps what controller-runtime gives it: its context's values and deadline
// (ReconciliationTimeout still ends it), and its panics, which reach controller-runtime
// (RecoverPanic, the panic metric and log) with their original stack, once the executor
// settled and counted the call. What changes: while ex is owned by a runnable.Runnable, the
// reconcile's context ignores controller-runtime's cancellation at shutdown and ends when
// the drain cancels it (drain.Options.CancelAfter), so a reconcile in flight can finish
// within the grace period. With an executor no Runnable owns, the context is the one
// controller-runtime passed, deadline and cancellation alike.
//
// Once ex drains, new requests are not run: they are requeued (see WithRequeueAfter), with
// one V(1) log line, not an error per request. So is a reconcile that returns an error
// wrapping drain.ErrDraining: one whose handler Call the drain refused.
func Wrap(ex *drain.Executor, controller string, r reconcile.Reconciler, opts ...Option) reconcile.Reconciler {
	return WrapTyped(ex, controller, r, opts...)
}

// WrapTyped is Wrap for a reconcile.TypedReconciler. The call is named
// "<controller>/<request>", the request rendered by its String method if it has one, else
// by fmt's %v.
func WrapTyped[R comparable](
	ex *drain.Executor, controller string, r reconcile.TypedReconciler[R], opts ...Option,
) reconcile.TypedReconciler[R] {
	o := options{requeueAfter: DefaultRequeueAfter}
	for _, opt := range opts {
		opt(&o)
	}
	w := &wrapped[R]{ex: ex, r: r, opts: o, controller: controller, name: namer[R](controller)}
	w.invocations.New = func() any {
		inv := &invocation[R]{r: r}
		inv.fn = inv.run
		return inv
	}
	return w
}

type wrapped[R comparable] struct {
	ex          *drain.Executor
	r           reconcile.TypedReconciler[R]
	opts        options
	controller  string
	name        func(R) [4]string
	refusedLog  sync.Once
	invocations sync.Pool // *invocation[R]
}

// invocation carries one Reconcile into the tracked call and its result out. It is pooled
// with its fn bound once: a closure per reconcile would cost an allocation each.
type invocation[R comparable] struct {
	r   reconcile.TypedReconciler[R]
	req R
	res reconcile.Result
	fn  func(context.Context) error // run
}

func (inv *invocation[R]) run(ctx context.Context) error {
	var err error
	inv.res, err = inv.r.Reconcile(ctx, inv.req)
	return err
}

func (w *wrapped[R]) Reconcile(ctx context.Context, req R) (reconcile.Result, error) {
	if w.ex == nil || w.r == nil {
		return reconcile.Result{}, reconcile.TerminalError(
			errors.New("failed to reconcile: reconcilers.Wrap got a nil executor or reconciler"))
	}
	// Run, not Call: controller-runtime's worker waits for its reconcile anyway, so the
	// reconcile runs on that goroutine, tracked, with no hand-off. Run never returns before
	// fn, so inv is free again once it returned; if fn panics, inv is simply not reused.
	inv := w.invocations.Get().(*invocation[R])
	inv.req = req
	err := internal.Run(w.ex, ctx, internal.CallOptions{
		Name:       w.name(req),
		Controller: w.controller,
		Shield:     true,
		Repanic:    true,
	}, inv.fn)
	res := inv.res
	var zero R
	inv.req, inv.res = zero, reconcile.Result{}
	w.invocations.Put(inv)
	if errors.Is(err, drain.ErrDraining) {
		w.refusedLog.Do(func() {
			log.FromContext(ctx).V(1).Info("Executor is draining: requeueing requests instead of running them")
		})
		return reconcile.Result{RequeueAfter: w.opts.requeueAfter}, nil
	}
	return res, err
}

// namer returns the function giving the parts of a reconcile's name, chosen once: a
// reconcile.Request is split without going through an interface (no allocation), and the
// executor joins the parts only when a report or Pending needs the name.
func namer[R comparable](controller string) func(R) [4]string {
	var zero R
	if _, ok := any(zero).(reconcile.Request); ok {
		return any(func(r reconcile.Request) [4]string {
			return [4]string{controller, r.Namespace, r.Name}
		}).(func(R) [4]string)
	}
	return func(req R) [4]string {
		if s, ok := any(req).(fmt.Stringer); ok {
			return [4]string{controller, s.String()}
		}
		return [4]string{controller, fmt.Sprint(req)}
	}
}

// Call runs a blocking handler call from inside a wrapped reconciler as a tracked call
// named "<reconcile name>/<name>", and waits for it like drain.Executor.Call: if ctx ends
// first, Call returns ctx.Err() and fn stays tracked. Calls nest: a Call inside fn is named
// "<reconcile name>/<name>/<inner name>". Inside any other tracked call (drain.FromContext)
// it is named after that call. Outside a tracked call it runs fn(ctx) directly. A panic in
// fn becomes a *drain.PanicError either way; an empty name or a nil fn is an error wrapping
// drain.ErrInvalidCall.
func Call(ctx context.Context, name string, fn func(context.Context) error) error {
	if name == "" {
		return fmt.Errorf("failed to run call: empty name: %w", drain.ErrInvalidCall)
	}
	ex, outer, ok := internal.CallOf(ctx)
	if !ok {
		return direct(ctx, name, fn)
	}
	return internal.Call(ex, ctx, internal.CallOptions{
		Name:       [4]string{outer.Name[0], name},
		Controller: outer.Controller,
	}, fn)
}

// direct runs fn on the caller's goroutine, with the executor's guarantees for bad input
// and panics, so that code behaves the same wrapped or not.
func direct(ctx context.Context, name string, fn func(context.Context) error) (err error) {
	if fn == nil {
		return fmt.Errorf("failed to run call %q: nil func: %w", name, drain.ErrInvalidCall)
	}
	defer func() {
		if v := recover(); v != nil {
			err = &drain.PanicError{Name: name, Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}
