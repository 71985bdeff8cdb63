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
// ("<controller>/<name>" for cluster-scoped objects). Inside it, Call runs blocking handler
// calls as tracked calls too.
//
// While ex is driven by a started runnable.Runnable, the reconcile's context is shielded
// from controller-runtime's shutdown: it ends when the drain cancels it (drain.Options
// CancelAfter), so a reconcile in flight can finish within the grace period. Otherwise the
// context is the one controller-runtime passed.
//
// Once ex drains, new requests are not run: they are requeued (see WithRequeueAfter), with
// one V(1) log line, not an error per request.
func Wrap(ex *drain.Executor, controller string, r reconcile.Reconciler, opts ...Option) reconcile.Reconciler {
	return WrapTyped(ex, controller, r, opts...)
}

// WrapTyped is Wrap for a reconcile.TypedReconciler. The call is named
// "<controller>/<request>", the request rendered by its String method if it has one, else
// by fmt's %v.
func WrapTyped[R comparable](ex *drain.Executor, controller string, r reconcile.TypedReconciler[R], opts ...Option) reconcile.TypedReconciler[R] {
	o := options{requeueAfter: DefaultRequeueAfter}
	for _, opt := range opts {
		opt(&o)
	}
	return &wrapped[R]{ex: ex, controller: controller, r: r, opts: o}
}

type wrapped[R comparable] struct {
	ex         *drain.Executor
	controller string
	r          reconcile.TypedReconciler[R]
	opts       options
	refusedLog sync.Once
}

// outcome carries Reconcile's result out of the tracked call. Call may return before fn
// when the caller's context ends, so the result is published under a lock, not a plain write.
type outcome struct {
	mu  sync.Mutex
	res reconcile.Result
	set bool
}

func (w *wrapped[R]) Reconcile(ctx context.Context, req R) (reconcile.Result, error) {
	if w.ex == nil || w.r == nil {
		return reconcile.Result{}, reconcile.TerminalError(errors.New("failed to reconcile: reconcilers.Wrap got a nil executor or reconciler"))
	}
	name := w.controller + "/" + render(req)
	callCtx := ctx
	if w.ex.Driven() {
		// The drain, not controller-runtime's shutdown, ends this reconcile (DESIGN.md).
		callCtx = context.WithoutCancel(ctx)
	}
	var out outcome
	err := w.ex.Call(callCtx, name, func(ctx context.Context) error {
		res, err := w.r.Reconcile(withScope(ctx, w.ex, name), req)
		out.mu.Lock()
		out.res, out.set = res, true
		out.mu.Unlock()
		return err
	})
	if errors.Is(err, drain.ErrDraining) {
		w.refusedLog.Do(func() {
			log.FromContext(ctx).V(1).Info("Executor is draining: requeueing requests instead of running them")
		})
		return reconcile.Result{RequeueAfter: w.opts.requeueAfter}, nil
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	return out.res, err
}

func render[R comparable](req R) string {
	switch r := any(req).(type) {
	case reconcile.Request:
		if r.Namespace == "" {
			return r.Name
		}
		return r.Namespace + "/" + r.Name
	case fmt.Stringer:
		return r.String()
	default:
		return fmt.Sprint(req)
	}
}

type scopeKey struct{}

// scope is what a wrapped reconcile puts in its context for Call.
type scope struct {
	ex   *drain.Executor
	name string
}

func withScope(ctx context.Context, ex *drain.Executor, name string) context.Context {
	return context.WithValue(ctx, scopeKey{}, scope{ex: ex, name: name})
}

// Call runs a blocking handler call from inside a wrapped reconciler as a tracked call
// named "<reconcile name>/<name>", and waits for it like drain.Executor.Call: if ctx ends
// first, Call returns ctx.Err() and fn stays tracked. Calls nest: a Call inside fn is named
// "<reconcile name>/<name>/<inner name>". Outside a wrapped reconciler it runs fn(ctx)
// directly. A panic in fn becomes a *drain.PanicError either way.
func Call(ctx context.Context, name string, fn func(context.Context) error) error {
	if name == "" {
		return fmt.Errorf("failed to run call: empty name: %w", drain.ErrInvalidCall)
	}
	s, ok := ctx.Value(scopeKey{}).(scope)
	if !ok {
		return direct(ctx, name, fn)
	}
	full := s.name + "/" + name
	return s.ex.Call(ctx, full, func(ctx context.Context) error {
		return fn(withScope(ctx, s.ex, full))
	})
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
