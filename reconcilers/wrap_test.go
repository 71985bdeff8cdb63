package reconcilers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// TestMain checks that no goroutine outlives the tests, except the work queue's metrics
// loop of the controllers the benchmarks run (runController): controller-runtime shuts its
// queue down from a goroutine of its own once the controller's ctx ends, and the loop sees
// it only at its next tick (every 500ms), after the benchmark returned.
func TestMain(m *testing.M) {
	// controller-runtime's logger, the zero DaemonsOptions.Logger's: every line.
	log.SetLogger(crLog.logger(0))
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("k8s.io/client-go/util/workqueue.(*Typed[...]).updateUnfinishedWorkLoop"))
}

// crLog holds the lines logged to controller-runtime's logger (log.Log).
var crLog capture

func request(ns, name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}
}

// drained drains ex at the end of a test, so that no worker goroutine outlives it.
func drained(t *testing.T, ex *drain.Executor) {
	t.Helper()
	t.Cleanup(func() {
		if err := ex.Drain(context.Background()); err != nil {
			t.Errorf("Drain: %v", err)
		}
	})
}

func names(ps []drain.Pending) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

func TestWrapNamesTheCallAndPassesResults(t *testing.T) {
	ex := drain.New(drain.Options{})
	drained(t, ex)
	boom := errors.New("boom")
	var seen []string
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(_ context.Context, _ reconcile.Request) (reconcile.Result, error) {
		seen = names(ex.Pending())
		return reconcile.Result{RequeueAfter: 7 * time.Second}, boom
	}), reconcilers.WrapOptions{})

	res, err := r.Reconcile(context.Background(), request("ns", "obj"))
	if !errors.Is(err, boom) || res.RequeueAfter != 7*time.Second {
		t.Fatalf("Reconcile = %+v, %v; want RequeueAfter 7s and boom", res, err)
	}
	if want := []string{"cm/ns/obj"}; strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Fatalf("pending during reconcile = %q, want %q", seen, want)
	}

	// Cluster-scoped objects have no namespace segment.
	_, _ = r.Reconcile(context.Background(), request("", "node-1"))
	if want := "cm/node-1"; len(seen) != 1 || seen[0] != want {
		t.Fatalf("pending during cluster-scoped reconcile = %q, want %q", seen, want)
	}

	// A request without a name keeps its segments: "<controller>/<namespace>/<name>".
	for req, want := range map[reconcile.Request]string{request("ns", ""): "cm/ns/", request("", ""): "cm/"} {
		_, _ = r.Reconcile(context.Background(), req)
		if len(seen) != 1 || seen[0] != want {
			t.Fatalf("pending during reconcile of %+v = %q, want %q", req, seen, want)
		}
	}
	if s := ex.Stats(); s.Started != 4 || s.Finished != 4 {
		t.Fatalf("stats = %+v, want 4 started and finished", s)
	}
}

type key struct{ kind, id string }

func (k key) String() string { return k.kind + ":" + k.id }

type plain struct{ n int }

func TestWrapTypedRendersTheRequest(t *testing.T) {
	ex := drain.New(drain.Options{})
	drained(t, ex)
	var seen []string
	kr := reconcilers.WrapTyped(ex, "typed", reconcile.TypedFunc[key](func(context.Context, key) (reconcile.Result, error) {
		seen = names(ex.Pending())
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{})
	if _, err := kr.Reconcile(context.Background(), key{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "typed/a:b" {
		t.Fatalf("pending = %q, want [typed/a:b]", seen)
	}
	pr := reconcilers.WrapTyped(ex, "plain", reconcile.TypedFunc[plain](func(context.Context, plain) (reconcile.Result, error) {
		seen = names(ex.Pending())
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{})
	if _, err := pr.Reconcile(context.Background(), plain{3}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "plain/{3}" {
		t.Fatalf("pending = %q, want [plain/{3}]", seen)
	}
}

func TestCallInsideAWrappedReconcileIsTracked(t *testing.T) {
	ex := drain.New(drain.Options{})
	drained(t, ex)
	var inner, nested []string
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		err := reconcilers.Call(ctx, "fetch", func(ctx context.Context) error {
			inner = names(ex.Pending())
			return reconcilers.Call(ctx, "dial", func(context.Context) error {
				nested = names(ex.Pending())
				return nil
			})
		})
		return reconcile.Result{}, err
	}), reconcilers.WrapOptions{})
	if _, err := r.Reconcile(context.Background(), request("ns", "obj")); err != nil {
		t.Fatal(err)
	}
	if want := "cm/ns/obj,cm/ns/obj/fetch"; strings.Join(inner, ",") != want {
		t.Fatalf("pending in handler = %q, want %s", inner, want)
	}
	if want := "cm/ns/obj,cm/ns/obj/fetch,cm/ns/obj/fetch/dial"; strings.Join(nested, ",") != want {
		t.Fatalf("pending in nested handler = %q, want %s", nested, want)
	}
}

// TestCallRaisesTheOriginalPanicValue: a panic in a Call, nested or not, reaches the
// reconcile's caller (controller-runtime) with the value fn panicked with, as
// controller-runtime's own recover raises it again, and is counted and logged once, with
// fn's stack.
func TestCallRaisesTheOriginalPanicValue(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		value any
		same  func(any) bool
	}{
		{"an error", boom, func(v any) bool { return v == boom }}, //nolint:errorlint // the value itself
		{"a string", "crash", func(v any) bool { return v == "crash" }},
		{"a slice", []int{1, 2}, func(v any) bool { s, ok := v.([]int); return ok && len(s) == 2 && s[1] == 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged capture
			ex := drain.New(drain.Options{Logger: logged.logger(0)})
			drained(t, ex)
			r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				return reconcile.Result{}, reconcilers.Call(ctx, "fetch", func(ctx context.Context) error {
					return reconcilers.Call(ctx, "dial", func(context.Context) error { panic(tc.value) })
				})
			}), reconcilers.WrapOptions{})
			v := func() (v any) {
				defer func() { v = recover() }()
				_, _ = r.Reconcile(context.Background(), request("ns", "obj"))
				return nil
			}()
			if _, isPE := v.(*drain.PanicError); isPE || !tc.same(v) {
				t.Fatalf("Reconcile panicked with %#v, want %#v", v, tc.value)
			}
			if st := ex.Stats(); st.Panicked != 1 {
				t.Errorf("Stats().Panicked = %d, want 1: one panic, counted once", st.Panicked)
			}
			// fn ran on a goroutine of its own: the executor logs where it panicked, once,
			// since the panic raised on the caller's goroutine shows only the caller's stack.
			var lines []string
			for _, l := range logged.all() {
				if strings.Contains(l, "Call panicked") {
					lines = append(lines, l)
				}
			}
			if len(lines) != 1 || !strings.Contains(lines[0], "cm/ns/obj/fetch/dial") ||
				!strings.Contains(lines[0], "TestCallRaisesTheOriginalPanicValue") {
				t.Errorf("want one \"Call panicked\" line naming cm/ns/obj/fetch/dial with the stack of its fn, got %q", lines)
			}
		})
	}
}

func TestCallOutsideAWrappedReconcileRunsDirectly(t *testing.T) {
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	ran := false
	err := reconcilers.Call(ctx, "direct", func(ctx context.Context) error {
		ran = ctx.Value(ctxKey{}) == "v"
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Call = %v, ran with the caller's ctx = %v", err, ran)
	}

	// A panic travels as inside a wrapped reconcile: raised on the caller's goroutine with
	// the value fn panicked with.
	v := func() (v any) {
		defer func() { v = recover() }()
		_ = reconcilers.Call(ctx, "boom", func(context.Context) error { panic("kaboom") })
		return nil
	}()
	if v != "kaboom" {
		t.Fatalf("Call of a panicking fn panicked with %#v, want %q", v, "kaboom")
	}

	if err := reconcilers.Call(ctx, "nil", nil); !errors.Is(err, drain.ErrInvalidCall) {
		t.Fatalf("Call(nil fn) = %v, want ErrInvalidCall", err)
	}
	if err := reconcilers.Call(ctx, "", func(context.Context) error { return nil }); !errors.Is(err, drain.ErrInvalidCall) {
		t.Fatalf("Call(empty name) = %v, want ErrInvalidCall", err)
	}
}

// A nil reconciler panics at setup; a nil executor does not (see
// TestWrapWithNilExecutorRunsUntracked).
func TestWrapWithNilReconcilerPanicsAtSetup(t *testing.T) {
	for name, wrap := range map[string]func(){
		"Wrap nil reconciler":               func() { reconcilers.Wrap(drain.New(drain.Options{}), "cm", nil, reconcilers.WrapOptions{}) },
		"Wrap nil reconciler, nil executor": func() { reconcilers.Wrap(nil, "cm", nil, reconcilers.WrapOptions{}) },
		"WrapTyped nil reconciler": func() {
			reconcilers.WrapTyped[reconcile.Request](drain.New(drain.Options{}), "cm", nil, reconcilers.WrapOptions{})
		},
		// A typed nil is nil (quiesce's rule for plug-ins): refused at setup, not at the
		// first reconcile.
		"Wrap typed-nil reconciler": func() {
			reconcilers.Wrap(drain.New(drain.Options{}), "cm", (*nilReconciler)(nil), reconcilers.WrapOptions{})
		},
		"Wrap nil reconcile.Func": func() {
			reconcilers.Wrap(drain.New(drain.Options{}), "cm", reconcile.Func(nil), reconcilers.WrapOptions{})
		},
	} {
		v := func() (v any) {
			defer func() { v = recover() }()
			wrap()
			return nil
		}()
		if msg, _ := v.(string); !strings.Contains(msg, `(cm)`) && !strings.Contains(msg, `("cm")`) || !strings.Contains(msg, "nil reconciler") {
			t.Errorf("%s: panicked with %#v, want a message naming the controller and the nil argument", name, v)
		}
	}
}

func TestWrapWithAnEmptyControllerPanicsAtSetup(t *testing.T) {
	ok := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	})
	for name, wrap := range map[string]func(){
		"Wrap": func() { reconcilers.Wrap(drain.New(drain.Options{}), "", ok, reconcilers.WrapOptions{}) },
		"WrapTyped": func() {
			reconcilers.WrapTyped[reconcile.Request](drain.New(drain.Options{}), "", ok, reconcilers.WrapOptions{})
		},
	} {
		v := func() (v any) {
			defer func() { v = recover() }()
			wrap()
			return nil
		}()
		if msg, _ := v.(string); !strings.HasPrefix(msg, "reconcilers."+name+": empty controller name") {
			t.Errorf("%s: panicked with %#v, want a message naming the empty controller", name, v)
		}
	}
}

// nilReconciler is a reconciler whose nil pointer a caller may pass by mistake.
type nilReconciler struct{ reconcile.Reconciler }

// capture is a logr sink that records each line as "msg k=v ...".
type capture struct {
	mu    sync.Mutex
	lines []string
}

func (c *capture) logger(verbosity int) logr.Logger {
	return funcr.New(func(_, args string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, args)
	}, funcr.Options{Verbosity: verbosity})
}

func (c *capture) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

func TestRequestsAfterTheDrainBeganAreRequeuedNotRun(t *testing.T) {
	ex := drain.New(drain.Options{})
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	var logs capture
	ran := 0
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		ran++
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{RequeueAfter: 3 * time.Second})
	ctx := log.IntoContext(context.Background(), logs.logger(1))
	for range 3 {
		res, err := r.Reconcile(ctx, request("ns", "obj"))
		if err != nil || res.RequeueAfter != 3*time.Second {
			t.Fatalf("Reconcile = %+v, %v; want RequeueAfter 3s, no error", res, err)
		}
	}
	if ran != 0 {
		t.Fatalf("the reconciler ran %d times after the drain began", ran)
	}
	lines := logs.all()
	if len(lines) != 1 || !strings.Contains(lines[0], "Executor is draining") || !strings.Contains(lines[0], `"level"=1`) {
		t.Fatalf("log = %q, want one V(1) line", lines)
	}
	if s := ex.Stats(); s.Refused != 3 {
		t.Fatalf("refused = %d, want 3", s.Refused)
	}
}

func TestContextOfAWrappedReconcile(t *testing.T) {
	t.Run("not driven: controller-runtime's context ends it", func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drained(t, ex)
		ctx, cancel := context.WithCancel(context.Background())
		r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			cancel()
			<-ctx.Done()
			return reconcile.Result{}, ctx.Err()
		}), reconcilers.WrapOptions{})
		if _, err := r.Reconcile(ctx, request("ns", "obj")); !errors.Is(err, context.Canceled) {
			t.Fatalf("Reconcile = %v, want context.Canceled", err)
		}
	})

	t.Run("driven: the drain ends it at CancelAfter, not the caller", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ex := drain.New(drain.Options{CancelAfter: 10 * time.Second})
			internal.Of(ex).Settings().Owned = true
			ctx, cancel := context.WithCancel(context.Background())
			var live bool
			started := make(chan struct{})
			r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				close(started)
				time.Sleep(3 * time.Second) // the reconcile's own work: fake time in the bubble
				live = ctx.Err() == nil
				return reconcile.Result{}, nil
			}), reconcilers.WrapOptions{})
			done := make(chan error, 1)
			go func() {
				_, err := r.Reconcile(ctx, request("ns", "obj"))
				done <- err
			}()
			<-started
			cancel() // controller-runtime's shutdown
			drainErr := make(chan error, 1)
			go func() { drainErr <- ex.Drain(context.Background()) }()
			if err := <-done; err != nil {
				t.Fatalf("Reconcile = %v, want nil", err)
			}
			if !live {
				t.Fatal("the reconcile's context ended before CancelAfter")
			}
			if err := <-drainErr; err != nil {
				t.Fatal(err)
			}
		})
	})

	t.Run("driven: CancelAfter cancels a reconcile that outlives it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ex := drain.New(drain.Options{CancelAfter: 10 * time.Second})
			internal.Of(ex).Settings().Owned = true
			start := time.Now()
			r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				<-ctx.Done()
				return reconcile.Result{}, ctx.Err()
			}), reconcilers.WrapOptions{})
			done := make(chan error, 1)
			go func() {
				_, err := r.Reconcile(context.Background(), request("ns", "obj"))
				done <- err
			}()
			synctest.Wait()
			if err := ex.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Reconcile = %v, want context.Canceled", err)
			}
			if took := time.Since(start); took != 10*time.Second {
				t.Fatalf("the reconcile was cancelled after %v, want 10s", took)
			}
		})
	})
}

// A reconcile in flight when the drain begins finishes: its handler Call runs (the README's
// promise). New work it starts (a call not nested in it, a daemon) is refused, and a
// reconcile that returns that refusal is requeued quietly.
func TestAReconcileInFlightWhenTheDrainBeginsRunsItsHandler(t *testing.T) {
	ran := false
	wrap := func(ex *drain.Executor) reconcile.Reconciler {
		return reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			go func() { _ = ex.Drain(context.Background()) }()
			<-ex.Draining() // the drain begins while the reconcile runs
			if err := reconcilers.Call(ctx, "upload", func(context.Context) error {
				ran = true
				return nil
			}); err != nil {
				return reconcile.Result{}, fmt.Errorf("failed to upload: %w", err)
			}
			if req.Name == "new-work" {
				err := ex.Call(context.Background(), "unrelated", func(context.Context) error { return nil })
				return reconcile.Result{}, fmt.Errorf("failed to start: %w", err)
			}
			return reconcile.Result{RequeueAfter: time.Hour}, nil
		}), reconcilers.WrapOptions{RequeueAfter: 2 * time.Second})
	}
	// CancelAfter leaves the reconcile's context live.
	ex := drain.New(drain.Options{CancelAfter: time.Minute})
	drained(t, ex)
	res, err := wrap(ex).Reconcile(context.Background(), request("ns", "obj"))
	if err != nil || res.RequeueAfter != time.Hour || !ran {
		t.Fatalf("Reconcile = %+v, %v, handler ran: %t; want the handler run and the reconcile's result", res, err, ran)
	}

	ran = false
	ex = drain.New(drain.Options{CancelAfter: time.Minute})
	drained(t, ex)
	res, err = wrap(ex).Reconcile(context.Background(), request("ns", "new-work"))
	if err != nil || res.RequeueAfter != 2*time.Second || !ran {
		t.Fatalf("Reconcile = %+v, %v, handler ran: %t; want the handler run, then RequeueAfter 2s and no error", res, err, ran)
	}
}

// With MaxConcurrent 1, a reconcile's handler Calls run in its slot (no self-deadlock), and
// a reconcile that controller-runtime cancels while it waits for the slot is requeued
// quietly, not returned as an error.
func TestMaxConcurrentBoundsReconcilesNotTheirCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{MaxConcurrent: 1, CancelAfter: -1})
		drained(t, ex)
		release := make(chan struct{})
		inner := make(chan error, 1)
		r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			if req.Name == "first" {
				inner <- reconcilers.Call(ctx, "sdk", func(context.Context) error { return nil })
				<-release
			}
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{})
		first := make(chan error, 1)
		go func() {
			_, err := r.Reconcile(context.Background(), request("ns", "first"))
			first <- err
		}()
		if err := <-inner; err != nil {
			t.Fatalf("Call inside the reconcile holding the only slot = %v", err)
		}

		ctx, cancel := context.WithCancel(context.Background())
		second := make(chan struct{})
		var res reconcile.Result
		var err error
		go func() {
			defer close(second)
			res, err = r.Reconcile(ctx, request("ns", "second"))
		}()
		synctest.Wait() // waits for the slot
		cancel()        // controller-runtime's stop
		<-second
		if err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter {
			t.Errorf("a reconcile cancelled while waiting for a slot = %+v, %v; want a quiet requeue", res, err)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	})
}

// Through a Runnable, a request refused by the drain is held until the drain is over, or
// until controller-runtime ends its context, and then requeued: once per stop, not every
// RequeueAfter while the leader-election group still runs.
func TestRefusedRequestHeldUntilTheDrainIsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := runnable.New(runnable.Options{GracePeriod: 10 * time.Second})
		ran := 0
		r := reconcilers.Wrap(q.Executor(), "cm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			ran++
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{})
		// A call in flight keeps the drain going for 3s.
		if err := q.Executor().Go(context.Background(), "slow", func(context.Context) error {
			time.Sleep(3 * time.Second)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		stop()
		started := make(chan error, 1)
		go func() { started <- q.Run(ctx) }()
		<-q.Executor().Draining()

		// controller-runtime's context ends first (the controller stops): released then.
		crCtx, crStop := context.WithTimeout(context.Background(), time.Second)
		defer crStop()
		begin := time.Now()
		res, err := r.Reconcile(crCtx, request("ns", "a"))
		if took := time.Since(begin); err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter || took != time.Second {
			t.Errorf("Reconcile = %+v, %v after %v; want a requeue when its context ended (1s)", res, err, took)
		}
		// Otherwise when the drain is over, at 3s.
		res, err = r.Reconcile(context.Background(), request("ns", "b"))
		if took := time.Since(begin); err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter || took != 3*time.Second {
			t.Errorf("Reconcile = %+v, %v after %v; want a requeue when the drain was over (3s)", res, err, took)
		}
		// After the drain, at once.
		if _, err := r.Reconcile(context.Background(), request("ns", "c")); err != nil || time.Since(begin) != 3*time.Second {
			t.Errorf("Reconcile after the drain = %v after %v, want at once", err, time.Since(begin))
		}
		if ran != 0 {
			t.Errorf("the reconciler ran %d times during the drain", ran)
		}
		if err := <-started; err != nil {
			t.Fatal(err)
		}
	})
}

// A refused request waits only for a drain that its Runnable began: the executor of a
// Runner never run, drained directly, is not waited for, so Reconcile with a context
// that never ends returns (a wait for the Runnable's Done would never end).
func TestRefusedRequestNotHeldWithoutTheRunnablesDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := runnable.New(runnable.Options{GracePeriod: 10 * time.Second})
		r := reconcilers.Wrap(q.Executor(), "cm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			t.Error("the reconciler ran during the drain")
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{})
		if err := q.Executor().Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			res, err := r.Reconcile(context.Background(), request("ns", "a"))
			if err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter {
				t.Errorf("Reconcile = %+v, %v; want a requeue", res, err)
			}
		}()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("Reconcile(context.Background()) still waits for a Runner that never ran")
		}
	})
}

// A Call from a goroutine that outlived its reconcile, made once the executor drains, is
// refused with an error wrapping drain.ErrDraining, as Call's doc says (it returned the
// reconcile context's context.Canceled).
func TestLateCallOfAReturnedReconcileIsRefusedWithErrDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		late := make(chan error, 1)
		r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			go func() {
				<-ex.Draining()
				late <- reconcilers.Call(ctx, "late", func(context.Context) error { return nil })
			}()
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{})
		if _, err := r.Reconcile(context.Background(), request("ns", "obj")); err != nil {
			t.Fatal(err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-late; !errors.Is(err, drain.ErrDraining) {
			t.Fatalf("late Call = %v, want an error wrapping drain.ErrDraining", err)
		}
	})
}
