package main

import (
	"os"
	"testing"
	"time"

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
	if q.Gap < time.Duration(0) {
		t.Errorf("quiesce run: handover gap %s < 0", q.Gap)
	}
	for _, r := range runs[1:] {
		t.Logf("%s run: %d of %d creates failed %q, %d reconciles cut off, %d lost, %d overlapping",
			r.Mode, r.Failed, r.Creates, r.Errors, r.CutOff, r.Lost, r.Overlaps)
	}
}

// TestCheckTimeline: out of order or missing steps fail the check.
func TestCheckTimeline(t *testing.T) {
	var ok []step
	for i, m := range timelineSteps {
		ok = append(ok, step{Msg: m, SinceStop: (time.Duration(i) * time.Second).String()})
	}
	if err := checkTimeline(ok); err != nil {
		t.Errorf("checkTimeline(in order) = %v, want nil", err)
	}
	if len(ok) >= 2 {
		swapped := append([]step(nil), ok...)
		swapped[0].SinceStop = "1h"
		if checkTimeline(swapped) == nil {
			t.Errorf("checkTimeline(out of order) = nil, want an error")
		}
	}
	if checkTimeline(append(ok, step{Msg: "extra", SinceStop: "2h"})) == nil {
		t.Errorf("checkTimeline(an extra step) = nil, want an error")
	}
}
