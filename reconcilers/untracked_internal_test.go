package reconcilers

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
)

// A Call outside a wrapped reconcile runs, and the first one of the process says so, once,
// through the context's logger.
func TestCallOutsideAWrappedReconcileIsLoggedOnce(t *testing.T) {
	untracked = sync.Once{}
	t.Cleanup(func() { untracked = sync.Once{} })
	var lines []string
	ctx := log.IntoContext(context.Background(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
	ran := 0
	for range 3 {
		if err := Call(ctx, "legacy-export", func(context.Context) error { ran++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if ran != 3 {
		t.Errorf("fn ran %d times, want 3", ran)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "Call outside a wrapped reconcile") ||
		!strings.Contains(lines[0], `"call"="legacy-export"`) || !strings.Contains(lines[0], "reconcilers.Wrap") {
		t.Fatalf("log = %q, want one line naming the call and how to track it", lines)
	}
}

// A nil executor (also a typed nil) means untracked: the reconciler runs as given, Call
// inside it runs fn directly, and the first Reconcile says so in one line, through the
// context's logger; neither a later Reconcile nor the Calls log again.
func TestWrapWithNilExecutorRunsUntracked(t *testing.T) {
	var typedNil *drain.Executor
	for name, ex := range map[string]*drain.Executor{"nil": nil, "typed nil": typedNil} {
		t.Run(name, func(t *testing.T) {
			untracked = sync.Once{}
			t.Cleanup(func() { untracked = sync.Once{} })
			var lines []string
			ctx := log.IntoContext(context.Background(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
			calls := 0
			inner := reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				if _, _, ok := drain.FromContext(ctx); ok {
					t.Error("the reconcile runs as a tracked call")
				}
				err := Call(ctx, "export", func(context.Context) error { calls++; return nil })
				return reconcile.Result{RequeueAfter: time.Minute}, err
			})
			r := Wrap(ex, "cm", inner, WrapOptions{})
			typed := WrapTyped[reconcile.Request](ex, "cm", inner, WrapOptions{})
			for range 3 {
				res, err := r.Reconcile(ctx, reconcile.Request{})
				if err != nil || res.RequeueAfter != time.Minute {
					t.Fatalf("Reconcile = %+v, %v; want the reconciler's result", res, err)
				}
			}
			if _, err := typed.Reconcile(ctx, reconcile.Request{}); err != nil {
				t.Fatal(err)
			}
			if calls != 4 {
				t.Errorf("Call ran fn %d times, want 4", calls)
			}
			if len(lines) != 2 || !strings.Contains(lines[0], "Reconciler wrapped without an executor") ||
				!strings.Contains(lines[0], `"controller"="cm"`) || !strings.Contains(lines[0], "runnable.Setup") ||
				lines[1] != lines[0] {
				t.Fatalf("log = %q, want one line per wrapped reconciler, naming the controller and what to set", lines)
			}
		})
	}
}
