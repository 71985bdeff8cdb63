package main

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	goleak.VerifyTestMain(m)
}

// TestRollout plays `make demo-rollout`: with quiesce, a rolling update of the leader fails
// no create and loses no reconcile, the two leaders never overlap, the old leader logs its
// timeline in order and exits 0. The plain controller-runtime run is printed, not checked.
func TestRollout(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	runs, err := run(t.Context(), config{Out: t.Output()})
	if err != nil {
		t.Fatalf("run() = %v", err)
	}
	t.Logf("the rollouts side by side:\n%s", table(runs))
	q := runs[0]
	if q.Mode != "quiesce" {
		t.Fatalf("first run = %s, want quiesce", q.Mode)
	}
	if err := q.check(); err != nil {
		t.Errorf("quiesce run: %v", err)
	}
	if q.Creates < 50 {
		t.Errorf("quiesce run: %d creates, want at least 50 for the run to mean something", q.Creates)
	}
	for _, r := range runs[1:] {
		t.Logf("%s run: %d of %d creates failed %q, %d reconciles cut off, %d lost, %d overlapping",
			r.Mode, r.Failed, r.Creates, r.Errors, r.CutOff, r.Lost, r.Overlaps)
	}
}

// TestCheckTimeline: the timeline of a good stop passes; out of order, missing or extra
// steps fail the check.
func TestCheckTimeline(t *testing.T) {
	good := []step{
		{"Stop began", "0s"}, {"Shutdown delay over", "2s"}, {"Draining executor", "2.03s"},
		{"All calls returned", "2.2s"}, {"Webhook server stopped", "2.21s"},
	}
	if err := checkTimeline(good); err != nil {
		t.Errorf("checkTimeline(good) = %v, want nil", err)
	}
	with := func(f func(s []step) []step) []step { return f(append([]step(nil), good...)) }
	for name, steps := range map[string][]step{
		"out of order":             with(func(s []step) []step { s[1].SinceStop = "1h"; return s }),
		"a step missing":           with(func(s []step) []step { return append(s[:1], s[2:]...) }),
		"an extra step":            with(func(s []step) []step { return append(s, step{"extra", "1h"}) }),
		"webhook stopped too soon": with(func(s []step) []step { s[3], s[4] = s[4], s[3]; return s }),
		"webhook never stopped":    with(func(s []step) []step { return s[:4] }),
		"sinceStop not a duration": with(func(s []step) []step { s[0].SinceStop = true; return s }),
	} {
		if checkTimeline(steps) == nil {
			t.Errorf("checkTimeline(%s) = nil, want an error", name)
		}
	}
}
