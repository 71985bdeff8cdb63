package reconcilers_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// quiesceFrames counts the frames of quiesce's own packages in a goroutine's stack.
func quiesceFrames(stack string) int {
	n := 0
	for _, l := range strings.Split(stack, "\n") {
		if strings.HasPrefix(l, "github.com/quiesce-dev/quiesce/") && !strings.HasPrefix(l, "github.com/quiesce-dev/quiesce/reconcilers_test.") {
			n++
		}
	}
	return n
}

func stack() string {
	buf := make([]byte, 1<<16)
	return string(buf[:runtime.Stack(buf, false)])
}

// A stack taken inside a wrapped reconcile (an error's, a panic's as RecoverPanic logs it)
// holds few quiesce frames: the numbers docs/operating.md gives ("quiesce's frames in your
// stacks").
func TestStacksInAWrappedReconcileHoldFewQuiesceFrames(t *testing.T) {
	ex := drain.New(drain.Options{})
	drained(t, ex)
	var inside string
	r := reconcilers.Wrap(ex, "cm", reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		inside = stack()
		if req.Name == "panic" {
			panic("boom")
		}
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{})
	if _, err := r.Reconcile(context.Background(), request("ns", "ok")); err != nil {
		t.Fatal(err)
	}
	if n := quiesceFrames(inside); n > 5 {
		t.Errorf("%d quiesce frames in a reconcile's stack, want at most 5:\n%s", n, inside)
	}
	var recovered string
	func() {
		defer func() {
			if recover() != nil {
				recovered = stack()
			}
		}()
		_, _ = r.Reconcile(context.Background(), request("ns", "panic"))
	}()
	if n := quiesceFrames(recovered); n > 6 || !strings.Contains(recovered, "TestStacksInAWrappedReconcileHoldFewQuiesceFrames.func1") {
		t.Errorf("%d quiesce frames in the stack where the panic is recovered, want at most 6, and the frame that panicked:\n%s", n, recovered)
	}
}
