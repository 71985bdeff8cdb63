package shutdowntest

import (
	"slices"
	"testing"
)

// Unfinished are the reconciles with a "Reconciling" line and no line that ends them; GaveUp
// is the manager's own error; Cut reads only the lines after SIGTERM.
func TestUnfinishedAndGaveUp(t *testing.T) {
	keys := func(name, id string) string {
		return `{"controller": "demo", "namespace": "ns", "name": "` + name + `", "reconcileID": "` + id + `"`
	}
	lines := []string{
		"T\tDEBUG\tReconciling\t" + keys("a", "1") + "}",
		"T\tDEBUG\tReconciling\t" + keys("b", "2") + "}",
		"T\tDEBUG\tReconciling\t" + keys("c", "3") + "}",
		"T\tERROR\tReconciler error\t" + keys("c", "3") + `, "error": "context canceled"}`,
		"T\tDEBUG\tReconcile done, requeueing after 5s\t" + keys("a", "1") + "}",
		"T\tERROR\tsetup\tProblem running manager\t" + `{"error": "` + GaveUpText + ` of 1s: context deadline exceeded"}`,
	}
	r := &Result{Lines: lines, signaled: 3, GaveUp: true}
	if got := r.Unfinished(); len(got) != 1 || got[0].Name != "b" {
		t.Errorf("Unfinished = %v, want ns/b alone", got)
	}
	if got := r.Cut(); len(got) != 1 || got[0].String() != "demo ns/c: context canceled" {
		t.Errorf("Cut = %v, want demo ns/c: context canceled", got)
	}
	r.signaled = 4
	if got := r.Cut(); len(got) != 0 {
		t.Errorf("Cut of the lines after SIGTERM = %v, want none", got)
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return (&Result{Lines: []string{l}}).gaveUp() }) {
		t.Error("no line gave up")
	}
}
