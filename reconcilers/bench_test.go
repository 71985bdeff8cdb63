package reconcilers_test

import (
	"context"
	"strconv"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// BenchmarkReconcileLoop measures reconcile throughput through controller-runtime's own
// loop (an in-memory channel source, the work queue, the workers), unwrapped (the baseline)
// and wrapped by reconcilers.Wrap. The ratio of the two ns/op is the cost of tracking.
func BenchmarkReconcileLoop(b *testing.B) {
	b.Run("unwrapped", func(b *testing.B) {
		benchLoop(b, func(r reconcile.Reconciler) reconcile.Reconciler { return r })
	})
	b.Run("wrapped", func(b *testing.B) {
		ex := drain.New(drain.Options{})
		defer func() { _ = ex.Drain(context.Background()) }()
		internal.Of(ex).Settings().Driven.Store(true) // as a runnable.Runnable does
		benchLoop(b, func(r reconcile.Reconciler) reconcile.Reconciler {
			return reconcilers.Wrap(ex, "bench", r, reconcilers.Options{})
		})
	})
}

func benchLoop(b *testing.B, wrap func(reconcile.Reconciler) reconcile.Reconciler) {
	var wg sync.WaitGroup
	r := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		wg.Done()
		return reconcile.Result{}, nil
	})
	events, stop := runController(b, "bench", wrap(r), 2)
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
		ex := drain.New(drain.Options{})
		defer func() { _ = ex.Drain(context.Background()) }()
		internal.Of(ex).Settings().Driven.Store(true) // shielded, as under a runnable.Runnable
		w := reconcilers.Wrap(ex, "bench", r, reconcilers.Options{})
		b.ReportAllocs()
		for b.Loop() {
			_, _ = w.Reconcile(context.Background(), req)
		}
	})
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
