package reconcilers

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/internal"
)

// abandoner is the internal.Observer of one controller wrapped with WrapOptions.OnAbandon.
type abandoner struct {
	controller string
	fn         func(context.Context, reconcile.Request)
	fenced     context.Context // the executor's: ended when the lease is lost
}

// Slow does nothing: OnAbandon is told of abandoned reconciles only.
func (a *abandoner) Slow(context.Context, []internal.Observed) {}

// Abandoned calls the hook once per abandoned reconcile of a's controller, each on a
// goroutine of its own, and returns when they all returned or ctx ended. ctx also ends
// when the lease is lost; from then on no hook is called. Lost before Abandoned began, it
// logs each skip itself and calls nothing.
func (a *abandoner) Abandoned(ctx context.Context, calls []internal.Observed) {
	var keys []types.NamespacedName
	seen := map[types.NamespacedName]bool{}
	for _, c := range calls {
		if t, ok := c.Options.Tag.(*eventTag); ok && t.ab == a && !seen[t.key] {
			seen[t.key] = true
			keys = append(keys, t.key)
		}
	}
	if len(keys) == 0 {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	if a.fenced.Err() != nil { // lost before the hooks: skip each here, before Abandoned returns
		for _, k := range keys {
			a.skip(log, k)
		}
		return
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(a.fenced, func() { cancel(context.Cause(a.fenced)) })
	defer stop()
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() { a.call(ctx, log, k) })
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		internal.Safely(func() {
			log.Info("OnAbandon hooks still running after their context ended: no longer waited for",
				"controller", a.controller, "cause", context.Cause(ctx).Error())
		})
	}
}

// call calls the hook for key unless the lease is lost, logging a skip or a panic.
func (a *abandoner) call(ctx context.Context, log logr.Logger, key types.NamespacedName) {
	if a.fenced.Err() != nil {
		a.skip(log, key)
		return
	}
	defer func() {
		if v := recover(); v != nil {
			internal.Safely(func() {
				log.Error(fmt.Errorf("%v", v), "OnAbandon panicked", "controller", a.controller,
					"namespace", key.Namespace, "name", key.Name, "stack", string(debug.Stack()))
			})
		}
	}()
	a.fn(ctx, reconcile.Request{NamespacedName: key})
}

// skip logs that the hook is not called for key: the lease is lost.
func (a *abandoner) skip(log logr.Logger, key types.NamespacedName) {
	internal.Safely(func() {
		log.Info("Skipping OnAbandon: the lease is lost", "controller", a.controller,
			"namespace", key.Namespace, "name", key.Name, "cause", context.Cause(a.fenced).Error())
	})
}
