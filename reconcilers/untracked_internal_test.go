package reconcilers

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/log"
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
