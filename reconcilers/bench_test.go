package reconcilers_test

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/internal/benchpair"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// BenchmarkReconcileLoop measures reconcile throughput through controller-runtime's own
// loop (an in-memory channel source, the work queue, the workers), unwrapped (the baseline)
// and wrapped by reconcilers.Wrap, with 2 workers and with 16 workers sharing one executor.
// The ratio of the two ns/op at each worker count is the cost of tracking.
func BenchmarkReconcileLoop(b *testing.B) {
	for _, workers := range []int{2, 16} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
			b.Run("unwrapped", func(b *testing.B) {
				benchLoopWorkers(b, workers, func(r reconcile.Reconciler) reconcile.Reconciler { return r })
			})
			b.Run("wrapped", func(b *testing.B) {
				ex := drivenExecutor(b)
				benchLoopWorkers(b, workers, func(r reconcile.Reconciler) reconcile.Reconciler {
					return reconcilers.Wrap(ex, "bench", r, reconcilers.WrapOptions{})
				})
			})
		})
	}
}

// benchLoop is benchLoopWorkers with 2 workers.
func benchLoop(b *testing.B, wrap func(reconcile.Reconciler) reconcile.Reconciler) {
	benchLoopWorkers(b, 2, wrap)
}

func benchLoopWorkers(b *testing.B, workers int, wrap func(reconcile.Reconciler) reconcile.Reconciler) {
	var wg sync.WaitGroup
	r := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		wg.Done()
		return reconcile.Result{}, nil
	})
	events, stop := runController(b, "bench", wrap(r), workers)
	defer stop()

	// Distinct keys, so that the queue does not merge them; made before the timer starts.
	reqs := make([]reconcile.Request, b.N)
	for i := range reqs {
		reqs[i] = request("default", "object-"+strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	wg.Add(b.N)
	for _, req := range reqs {
		events <- event.TypedGenericEvent[reconcile.Request]{Object: req}
	}
	wg.Wait()
	b.StopTimer()
}

// BenchmarkReconcileDirect calls Reconcile in a plain loop: the bare per-call overhead of
// Wrap, with nothing else around it.
func BenchmarkReconcileDirect(b *testing.B) {
	r := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	})
	req := request("ns", "obj")
	b.Run("unwrapped", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = r.Reconcile(context.Background(), req)
		}
	})
	b.Run("wrapped", func(b *testing.B) {
		w := reconcilers.Wrap(drivenExecutor(b), "bench", r, reconcilers.WrapOptions{})
		b.ReportAllocs()
		for b.Loop() {
			_, _ = w.Reconcile(context.Background(), req)
		}
	})
}

// BenchmarkReconcileLoopInterleaved is BenchmarkReconcileLoop with both controllers
// running at once, fed alternately in blocks short enough that both see the same load on a
// busy machine. It reports the medians over the blocks of each one's ns/op and of the
// throughput ratio wrapped/unwrapped (the budgets of issue 31: at least 0.90 with 2
// workers, and no more than 0.03 less with 16 workers on one executor).
func BenchmarkReconcileLoopInterleaved(b *testing.B) {
	wrap := func(executor func(*testing.B) *drain.Executor) func(*testing.B, reconcile.Reconciler) reconcile.Reconciler {
		return func(b *testing.B, r reconcile.Reconciler) reconcile.Reconciler {
			return reconcilers.Wrap(executor(b), "bench", r, reconcilers.WrapOptions{})
		}
	}
	for _, bench := range []struct {
		name    string
		workers int
		wrap    func(*testing.B, reconcile.Reconciler) reconcile.Reconciler
	}{
		{"workers=2", 2, wrap(drivenExecutor)},
		{"workers=16", 16, wrap(drivenExecutor)},
		// As runnable.Add makes it for the README's main.go: each call's duration observed
		// in quiesce_call_duration_seconds.
		{"workers=2,metrics", 2, wrap(meteredExecutor)},
		// The floor of tracking, in place of Wrap (see floorReconciler).
		{"workers=2,floor", 2, func(_ *testing.B, r reconcile.Reconciler) reconcile.Reconciler {
			return &floorReconciler{r: r}
		}},
	} {
		b.Run(bench.name, func(b *testing.B) {
			unwrapped := startLoop(b, "unwrapped", bench.workers, func(r reconcile.Reconciler) reconcile.Reconciler { return r })
			wrapped := startLoop(b, "wrapped", bench.workers, func(r reconcile.Reconciler) reconcile.Reconciler {
				return bench.wrap(b, r)
			})
			// Distinct keys, so that the queue does not merge them; made before the timer starts.
			reqs := make([]reconcile.Request, b.N)
			for i := range reqs {
				reqs[i] = request("default", "object-"+strconv.Itoa(i))
			}
			var next [2]int
			feed := func(l *loop, i int) func(n int) {
				return func(n int) {
					l.wg.Add(n)
					for _, req := range reqs[next[i] : next[i]+n] {
						l.events <- event.TypedGenericEvent[reconcile.Request]{Object: req}
					}
					next[i] += n
					l.wg.Wait()
				}
			}
			// The time ratio unwrapped/wrapped is the throughput ratio wrapped/unwrapped.
			_, _, ratio := benchpair.Interleaved(b, 100, "unwrapped", feed(unwrapped, 0), "wrapped", feed(wrapped, 1))
			b.ReportMetric(ratio, "wrapped/unwrapped-throughput")
		})
	}
}

// BenchmarkReconcileDirectInterleaved is BenchmarkReconcileDirect with both calls
// alternating in blocks: it reports the medians over the blocks of each one's ns/op, and
// what the wrapped call costs over the bare one, in time and in allocations (the budgets
// of issues 23 and 31: 1µs and 2 allocations at most), and the bytes it allocates.
func BenchmarkReconcileDirectInterleaved(b *testing.B) {
	r := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	})
	req := request("ns", "obj")
	w := reconcilers.Wrap(drivenExecutor(b), "bench", r, reconcilers.WrapOptions{})
	wrapped := func() { _, _ = w.Reconcile(context.Background(), req) }
	unwrapped := func() { _, _ = r.Reconcile(context.Background(), req) }
	wrappedNs, unwrappedNs, _ := benchpair.Interleaved(b, 1000, "wrapped", func(n int) {
		for range n {
			wrapped()
		}
	}, "unwrapped", func(n int) {
		for range n {
			unwrapped()
		}
	})
	b.ReportMetric(wrappedNs-unwrappedNs, "over-ns/op")
	b.ReportMetric(testing.AllocsPerRun(100, wrapped)-testing.AllocsPerRun(100, unwrapped), "over-allocs/op")
	b.ReportMetric(bytesPerRun(1000, wrapped)-bytesPerRun(1000, unwrapped), "over-B/op")
}

// bytesPerRun is testing.AllocsPerRun for the bytes allocated: the mean over runs calls of
// f, after one warm-up call.
func bytesPerRun(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// drivenExecutor returns an executor driven as a runnable.Runnable drives it (wrapped
// reconciles are shielded), drained when the benchmark ends.
func drivenExecutor(b *testing.B) *drain.Executor {
	ex := drain.New(drain.Options{})
	internal.Of(ex).Settings().Owned = true
	b.Cleanup(func() { _ = ex.Drain(context.Background()) })
	return ex
}

// floorReconciler is the least a tracked reconcile can cost, for comparison: a record of
// the size of drain's (one 256-byte allocation), its start time read, and a mutex held to
// insert it in a doubly linked list and again to remove it. Nothing else: no name, no
// context, no labels, no panic handling, no counters.
type floorReconciler struct {
	r      reconcile.Reconciler
	mu     sync.Mutex
	newest *floorCall
}

type floorCall struct {
	prev, next *floorCall
	start      time.Time
	ctx        context.Context
	_          [25]uintptr // to drain's record size
}

func (f *floorReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	c := &floorCall{ctx: ctx, start: time.Now()}
	f.mu.Lock()
	c.prev = f.newest
	if f.newest != nil {
		f.newest.next = c
	}
	f.newest = c
	f.mu.Unlock()
	res, err := f.r.Reconcile(c.ctx, req)
	f.mu.Lock()
	if c.prev != nil {
		c.prev.next = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		f.newest = c.prev
	}
	f.mu.Unlock()
	return res, err
}

// meteredExecutor returns the executor of a Runnable made by runnable.Setup, as the README's
// main.go makes it: driven, and observing each call's duration in the metrics. The manager
// is never started: nothing reaches the address it is given.
func meteredExecutor(b *testing.B) *drain.Executor {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	mgrOpts := manager.Options{Metrics: server.Options{BindAddress: "0"}}
	r, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{})
	if err != nil {
		b.Fatal(err)
	}
	mgr, err := manager.New(cfg, mgrOpts)
	if err == nil {
		err = r.Add(mgr)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Executor().Drain(context.Background()) })
	return r.Executor()
}

// A loop is a controller of controller-runtime running in the background, fed by events;
// its reconciles count down wg.
type loop struct {
	events chan<- event.TypedGenericEvent[reconcile.Request]
	wg     sync.WaitGroup
}

func startLoop(b *testing.B, name string, workers int, wrap func(reconcile.Reconciler) reconcile.Reconciler) *loop {
	l := &loop{}
	r := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		l.wg.Done()
		return reconcile.Result{}, nil
	})
	events, stop := runController(b, name, wrap(r), workers)
	b.Cleanup(stop)
	l.events = events
	return l
}

// runController starts a controller of controller-runtime named name, fed by the returned
// channel (an in-memory source), with workers workers reconciling with r; stop stops it and
// waits for it.
func runController(
	tb testing.TB, name string, r reconcile.Reconciler, workers int,
) (events chan<- event.TypedGenericEvent[reconcile.Request], stop func()) {
	tb.Helper()
	c, err := controller.NewTypedUnmanaged(name, controller.TypedOptions[reconcile.Request]{
		Reconciler:              r,
		MaxConcurrentReconciles: workers,
		SkipNameValidation:      ptr.To(true),
		LogConstructor:          func(*reconcile.Request) logr.Logger { return logr.Discard() },
	})
	if err != nil {
		tb.Fatal(err)
	}
	ch := make(chan event.TypedGenericEvent[reconcile.Request], 1024)
	enqueue := handler.TypedFuncs[reconcile.Request, reconcile.Request]{
		GenericFunc: func(
			_ context.Context, e event.TypedGenericEvent[reconcile.Request], q workqueue.TypedRateLimitingInterface[reconcile.Request],
		) {
			q.Add(e.Object)
		},
	}
	if err := c.Watch(source.TypedChannel(ch, enqueue)); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Start(ctx) }()
	return ch, func() {
		cancel()
		if err := <-stopped; err != nil {
			tb.Error(err)
		}
	}
}
