package reconcilers_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/internal/metricstest"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// newDriven returns an executor as a runnable.Runnable owns it.
func newDriven(opts drain.Options) *drain.Executor {
	ex := drain.New(opts)
	internal.Of(ex).Settings().Owned = true
	return ex
}

func TestWrappedReconcileKeepsTheDeadline(t *testing.T) {
	for _, driven := range []bool{false, true} {
		t.Run(fmt.Sprint("driven=", driven), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ex := drain.New(drain.Options{CancelAfter: -1})
				internal.Of(ex).Settings().Owned = driven
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				want, _ := ctx.Deadline()
				start := time.Now()
				r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
					if d, ok := ctx.Deadline(); !ok || !d.Equal(want) {
						t.Errorf("Deadline() = %v, %v; want %v", d, ok, want)
					}
					<-ctx.Done()
					return reconcile.Result{}, ctx.Err()
				}), reconcilers.WrapOptions{})
				if _, err := r.Reconcile(ctx, request("ns", "obj")); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Reconcile = %v, want DeadlineExceeded", err)
				}
				if took := time.Since(start); took != 300*time.Millisecond {
					t.Errorf("the reconcile ended after %v, want its 300ms deadline", took)
				}
				if err := ex.Drain(context.Background()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

func TestShieldedReconcileEndsAtTheDeadlineAfterAShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := newDriven(drain.Options{CancelAfter: -1})
		manager, shutdown := context.WithCancel(context.Background())
		ctx, cancel := context.WithTimeout(manager, 5*time.Second) // ReconciliationTimeout
		defer cancel()
		start := time.Now()
		var aliveAfterShutdown bool
		r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			time.Sleep(time.Second)
			shutdown() // the manager stops: the shield ignores it
			time.Sleep(time.Second)
			aliveAfterShutdown = ctx.Err() == nil
			<-ctx.Done()
			return reconcile.Result{}, ctx.Err()
		}), reconcilers.WrapOptions{})
		if _, err := r.Reconcile(ctx, request("ns", "obj")); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Reconcile = %v, want DeadlineExceeded", err)
		}
		if !aliveAfterShutdown {
			t.Error("the manager's cancellation ended a shielded reconcile")
		}
		if took := time.Since(start); took != 5*time.Second {
			t.Errorf("the reconcile ended after %v, want its 5s deadline", took)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestWrappedReconcileRepanicsAfterTheCallSettled(t *testing.T) {
	ex := newDriven(drain.Options{})
	drained(t, ex)
	boom := errors.New("boom")
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		panicInReconcile(boom)
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{})
	var (
		value any
		stack string
		stats drain.Stats
	)
	func() {
		defer func() {
			value = recover()
			stack = string(debug.Stack())
			stats = ex.Stats()
		}()
		_, _ = r.Reconcile(context.Background(), request("ns", "obj"))
	}()
	if value != boom {
		t.Fatalf("recovered %v, want the reconciler's own panic value", value)
	}
	if !strings.Contains(stack, "reconcilers_test.panicInReconcile") {
		t.Errorf("the stack where the panic was recovered lost the reconciler's frames:\n%s", stack)
	}
	if stats.Panicked != 1 || stats.Finished != 1 || stats.InFlight != 0 {
		t.Errorf("Stats when the panic reached the caller = %+v, want the call settled and counted", stats)
	}
}

func panicInReconcile(v any) { panic(v) }

// TestPanicReachesControllerRuntime runs a wrapped reconciler that panics in a real
// controller (RecoverPanic by default): controller-runtime recovers the panic, counts it
// in its panic metric, and runs its panic handlers with the reconciler's stack.
func TestPanicReachesControllerRuntime(t *testing.T) {
	const name = "panicking-controller"
	ex := newDriven(drain.Options{})
	drained(t, ex)
	var (
		mu       sync.Mutex
		handled  []string
		atPanic  drain.Stats
		returned = make(chan struct{}, 2)
	)
	saved := utilruntime.PanicHandlers
	utilruntime.PanicHandlers = append(append([]func(context.Context, any){}, saved...), func(_ context.Context, v any) {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, fmt.Sprint(v), string(debug.Stack()))
		atPanic = ex.Stats()
	})
	t.Cleanup(func() { utilruntime.PanicHandlers = saved })

	calls := 0
	r := reconcilers.Wrap(ex, name, reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		defer func() { returned <- struct{}{} }()
		calls++
		if calls == 1 {
			panicInReconcile("reconciler broke")
		}
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{})
	before := panicsMetric(t, name)
	events, stop := runController(t, name, r, 1)
	events <- event.TypedGenericEvent[reconcile.Request]{Object: request("ns", "a")}
	<-returned
	events <- event.TypedGenericEvent[reconcile.Request]{Object: request("ns", "b")}
	<-returned // the controller lives on after the panic
	stop()

	if got := panicsMetric(t, name) - before; got != 1 {
		t.Errorf("controller_runtime_reconcile_panics_total grew by %v, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 2 || handled[0] != "reconciler broke" || !strings.Contains(handled[1], "reconcilers_test.panicInReconcile") {
		t.Errorf("controller-runtime's panic handlers saw %q, want the value and the reconciler's stack", handled)
	}
	if atPanic.Panicked != 1 || atPanic.Finished != 1 {
		t.Errorf("Stats when controller-runtime recovered = %+v, want the call settled and counted", atPanic)
	}
}

// panicsMetric reads controller-runtime's panic counter of a controller.
func panicsMetric(t *testing.T, name string) float64 {
	t.Helper()
	return metricstest.Value(t, "controller_runtime_reconcile_panics_total", map[string]string{"controller": name})
}

func TestShieldedReconcileKeepsTheCallersValues(t *testing.T) {
	// A shielded reconcile's context is its own (it derives from no context of the caller's)
	// yet answers every value of the caller's, and contexts derived from it end with it.
	ex := newDriven(drain.Options{CancelAfter: -1})
	drained(t, ex)
	type ctxKey struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	defer cancel()
	var child context.Context
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		if v := ctx.Value(ctxKey{}); v != "v" {
			t.Errorf("Value = %v, want the caller's v", v)
		}
		cancel()
		var stop context.CancelFunc
		child, stop = context.WithCancel(ctx)
		t.Cleanup(stop)
		return reconcile.Result{}, child.Err()
	}), reconcilers.WrapOptions{})
	if _, err := r.Reconcile(ctx, request("ns", "obj")); err != nil {
		t.Fatalf("Reconcile = %v, want nil: the caller's cancel does not reach a shielded reconcile", err)
	}
	<-child.Done() // ended with the reconcile
}

func TestShieldingIsFixedWhenTheExecutorIsOwned(t *testing.T) {
	// What decides the shield is the executor's owner, set before any reconcile runs;
	// nothing about the owner's Start. A reconcile before and after behave the same.
	ex := newDriven(drain.Options{CancelAfter: -1})
	drained(t, ex)
	for i := range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			cancel()
			return reconcile.Result{}, ctx.Err()
		}), reconcilers.WrapOptions{})
		if _, err := r.Reconcile(ctx, request("ns", fmt.Sprint(i))); err != nil {
			t.Errorf("reconcile %d: ctx.Err() = %v after the caller's cancel, want nil (shielded)", i, err)
		}
	}
}

// stuckReconciler waits in Reconcile until release is closed.
type stuckReconciler struct {
	at      chan string
	release chan struct{}
}

func (s *stuckReconciler) Reconcile(context.Context, reconcile.Request) (reconcile.Result, error) {
	s.at <- lineBelow()
	<-s.release
	return reconcile.Result{}, nil
}

func TestLocateNamesTheReconcilersOwnLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := newDriven(drain.Options{})
		s := &stuckReconciler{at: make(chan string, 1), release: make(chan struct{})}
		r := reconcilers.Wrap(ex, "cm", s, reconcilers.WrapOptions{})
		done := make(chan error, 1)
		go func() {
			_, err := r.Reconcile(context.Background(), request("ns", "obj"))
			done <- err
		}()
		at := <-s.at
		synctest.Wait() // the reconcile blocks on release
		calls, _ := ex.Locate(-1)
		close(s.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if len(calls) != 1 || calls[0].Name != "cm/ns/obj" || calls[0].Where != at || calls[0].Handler != at {
			t.Errorf("Locate = %+v, want cm/ns/obj at and in %q, the reconciler's own line", calls, at)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// lineBelow returns how a location shows the line below its caller.
func lineBelow() string {
	pc, file, line, _ := runtime.Caller(1)
	name := runtime.FuncForPC(pc).Name()
	name = name[strings.LastIndexByte(name, '/')+1:]
	return fmt.Sprintf("%s (%s:%d)", name, filepath.Base(file), line+1)
}

// TestCallPanicReachesControllerRuntime: a panic in a handler Call, while the reconcile
// waits for it, is raised on the reconcile's goroutine once the call settled: controller-
// runtime recovers the value the handler panicked with and counts it as a panic of the
// reconciler; the executor counts it once and logs it once, with the handler's stack.
func TestCallPanicReachesControllerRuntime(t *testing.T) {
	const name = "call-panicking-controller"
	var logged capture
	ex := newDriven(drain.Options{Logger: logged.logger(0)})
	drained(t, ex)
	var (
		mu      sync.Mutex
		handled []any
		atPanic drain.Stats
	)
	saved := utilruntime.PanicHandlers
	utilruntime.PanicHandlers = append(append([]func(context.Context, any){}, saved...), func(_ context.Context, v any) {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, v)
		atPanic = ex.Stats()
	})
	t.Cleanup(func() { utilruntime.PanicHandlers = saved })
	returned := make(chan struct{}, 1)
	r := reconcilers.Wrap(ex, name, reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		defer func() { returned <- struct{}{} }()
		return reconcile.Result{}, reconcilers.Call(ctx, "export", func(context.Context) error {
			panicInReconcile("handler broke")
			return nil
		})
	}), reconcilers.WrapOptions{})
	before := panicsMetric(t, name)
	events, stop := runController(t, name, r, 1)
	events <- event.TypedGenericEvent[reconcile.Request]{Object: request("ns", "a")}
	<-returned
	stop()
	if got := panicsMetric(t, name) - before; got != 1 {
		t.Errorf("controller_runtime_reconcile_panics_total grew by %v, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// The value the handler panicked with, as controller-runtime's own recover raises it
	// again: not a *drain.PanicError.
	if len(handled) != 1 || handled[0] != "handler broke" {
		t.Errorf("controller-runtime's panic handlers saw %#v, want the value the handler panicked with", handled)
	}
	if atPanic.Panicked != 1 || atPanic.Finished != 2 {
		t.Errorf("Stats when controller-runtime recovered = %+v, want both calls settled and counted", atPanic)
	}
	// controller-runtime logs the worker's stack, which shows the Call, not the handler's
	// line: the executor logs that, once.
	var lines []string
	for _, l := range logged.all() {
		if strings.Contains(l, "Call panicked") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "panicInReconcile") {
		t.Errorf("want one \"Call panicked\" line with the handler's stack (panicInReconcile), got %q", lines)
	}
}

// TestReconcileIDInReports: a wrapped reconcile and its Calls carry controller-runtime's
// reconcileID.
func TestReconcileIDInReports(t *testing.T) {
	const name = "reconcile-id-controller"
	ex := newDriven(drain.Options{})
	drained(t, ex)
	seen := make(chan string, 1)
	pending := make(chan []drain.Pending, 1)
	r := reconcilers.Wrap(ex, name, reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		seen <- string(controller.ReconcileIDFromContext(ctx))
		return reconcile.Result{}, reconcilers.Call(ctx, "export", func(context.Context) error {
			pending <- ex.Pending()
			return nil
		})
	}), reconcilers.WrapOptions{})
	events, stop := runController(t, name, r, 1)
	events <- event.TypedGenericEvent[reconcile.Request]{Object: request("ns", "a")}
	id, calls := <-seen, <-pending
	stop()
	if id == "" || len(calls) != 2 || calls[0].ReconcileID != id || calls[1].ReconcileID != id {
		t.Errorf("Pending = %+v, want the reconcile and its call with reconcileID %q", calls, id)
	}
}

// TestReconcileCancelledBeforeItBeganIsRequeuedQuietly: controller-runtime cancelled the
// context in the moment before the drain began; the request is requeued, not run, and
// no error reaches controller-runtime's "Reconciler error".
func TestReconcileCancelledBeforeItBeganIsRequeuedQuietly(t *testing.T) {
	for _, driven := range []bool{false, true} {
		ex := drain.New(drain.Options{})
		if driven {
			internal.Of(ex).Settings().Owned = true
		}
		r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			t.Error("ran")
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := r.Reconcile(ctx, request("ns", "a"))
		if err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter {
			t.Errorf("driven %v: Reconcile = %+v, %v; want a requeue and no error", driven, res, err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
