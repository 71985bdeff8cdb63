package reconcilers_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// BenchmarkDaemonsEnsureLoop measures, in controller-runtime's loop (see benchLoop), a
// wrapped reconcile without daemons and the same reconcile calling Ensure on a daemon that
// runs already (the steady state of an operator with daemons). The ratio of the two ns/op
// is the cost of Ensure on the hot path.
func BenchmarkDaemonsEnsureLoop(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer func() { _ = ex.Drain(context.Background()) }()
	internal.Of(ex).Settings().Owned = true // as a runnable.Runnable does
	d := reconcilers.NewDaemons(ex, "bench", reconcilers.DaemonsOptions{})
	daemon := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }

	// The requests of benchLoop are all distinct; they map onto 64 objects whose daemons run.
	objs := make([]*corev1.ConfigMap, 64)
	for i := range objs {
		objs[i] = daemonObject("object-"+strconv.Itoa(i), types.UID("uid-"+strconv.Itoa(i)))
		if err := d.Ensure(context.Background(), objs[i], "heartbeat", daemon); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Uint64

	b.Run("without", func(b *testing.B) {
		benchLoop(b, func(r reconcile.Reconciler) reconcile.Reconciler {
			return reconcilers.Wrap(ex, "bench", r, reconcilers.WrapOptions{})
		})
	})
	b.Run("ensure", func(b *testing.B) {
		benchLoop(b, func(r reconcile.Reconciler) reconcile.Reconciler {
			return reconcilers.Wrap(ex, "bench", reconcile.Func(
				func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
					if err := d.Ensure(ctx, objs[n.Add(1)%uint64(len(objs))], "heartbeat", daemon); err != nil {
						return reconcile.Result{}, err
					}
					return r.Reconcile(ctx, req)
				}), reconcilers.WrapOptions{})
		})
	})
	if s := d.Stats(); s.Running != len(objs) {
		b.Fatalf("%d daemons running, want %d", s.Running, len(objs))
	}
}

// BenchmarkDaemonsEnsureRunning is the bare cost of Ensure on a daemon that runs already.
func BenchmarkDaemonsEnsureRunning(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer func() { _ = ex.Drain(context.Background()) }()
	d := reconcilers.NewDaemons(ex, "bench", reconcilers.DaemonsOptions{})
	daemon := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	obj := daemonObject("object", "uid")
	ctx := context.Background()
	if err := d.Ensure(ctx, obj, "heartbeat", daemon); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Ensure(ctx, obj, "heartbeat", daemon); err != nil {
			b.Fatal(err)
		}
	}
}
