package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// moduleRoot is the module's root, relative to the package's directory.
const moduleRoot = "../.."

// One control plane for the package's tests, started by the first test that needs it and
// stopped by TestMain, before the leak check.
var shared struct {
	once sync.Once
	env  *envtest.Environment
	err  error
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "failed to stop the control plane:", err)
			code = 1
		}
	}
	if err := shutdowntest.Cleanup(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// environment returns the package's control plane, made by newEnvironment, once the
// operator is built too (the build runs while the control plane starts; shutdowntest.Build
// then returns the same binary at once).
func environment(t *testing.T) *envtest.Environment {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	shared.once.Do(func() {
		built := make(chan error, 1)
		go func() {
			_, err := shutdowntest.Build(context.Background(), shutdowntest.Options{Package: operatorPackage, Dir: moduleRoot})
			built <- err
		}()
		env := newEnvironment(moduleRoot)
		_, err := env.Start()
		if err != nil {
			shared.err = fmt.Errorf("failed to start the control plane: %w", err)
		} else {
			shared.env = env
		}
		shared.err = errors.Join(shared.err, <-built)
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.env
}

// TestRollout plays `make demo-rollout`: with quiesce, a rolling update of the leader fails
// no create and loses no reconcile, the two leaders never overlap, the old leader logs its
// timeline in order and exits 0. The plain controller-runtime run is printed, not checked.
func TestRollout(t *testing.T) {
	rep, err := run(t.Context(), config{Out: t.Output(), Env: environment(t)})
	if err != nil {
		t.Fatalf("run() = %v", err)
	}
	runs := rep.Rollouts
	t.Logf("the rollouts side by side:\n%s", table(runs))
	q := runs[0]
	if q.Mode != modeQuiesce {
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

	// The single-replica case: one replica, no shutdown delay, its webhook validating its
	// own writes, SIGTERM while its reconciles work.
	if len(rep.Single) != 2 {
		t.Fatalf("%d single-replica runs, want 2 (quiesce, plain)", len(rep.Single))
	}
	t.Logf("one replica, no shutdown delay, side by side:\n%s", singleTable(rep.Single))
	sq := rep.Single[0]
	if sq.Mode != modeQuiesce {
		t.Fatalf("first single-replica run = %s, want quiesce", sq.Mode)
	}
	if err := sq.check(); err != nil {
		t.Errorf("quiesce single-replica run: %v", err)
	}
	// check wants at least one own write per reconcile in flight; a write of another
	// reconcile during the drain would be one the drain should have refused.
	if sq.OwnWritesInDrain != sq.InFlight {
		t.Errorf("quiesce single-replica run: its webhook admitted %d own writes during the drain, want %d "+
			"(one per reconcile in flight at SIGTERM)", sq.OwnWritesInDrain, sq.InFlight)
	}
	for _, r := range rep.Single[1:] {
		t.Logf("%s single-replica run: %d of %d reconciles in flight finished, %d cut off %q, "+
			"%d own writes admitted after SIGTERM, %d left unreconciled, exit %d after %s",
			r.Mode, r.Finished, r.InFlight, r.CutOff, r.Errors, r.OwnWrites, r.Unreconciled, r.ExitCode, r.ExitAfter)
	}
}

// TestCheckTimeline: the timeline of a good stop passes; out of order, missing or extra
// steps fail the check.
func TestCheckTimeline(t *testing.T) {
	good := []step{
		{stepStopBegan, "0s"}, {stepDelayOver, "2s"}, {stepDraining, "2.03s"},
		{stepReturned, "2.2s"}, {stepWebhookStopped, "2.21s"},
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

// TestSingleMeasure: a single-replica stop in which the reconciles in flight finish and
// their writes are admitted during the drain passes the check; one cut off, a write after
// the drain or a webhook stopped before the drain's end fails it.
func TestSingleMeasure(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }
	line := func(d time.Duration, msg string, kv ...any) map[string]any {
		e := map[string]any{"ts": at(d), "msg": msg}
		for i := 0; i+1 < len(kv); i += 2 {
			e[kv[i].(string)] = kv[i+1]
		}
		return e
	}
	ended := func(start, end time.Duration, done bool, err string) map[string]any {
		return line(end, reconcileEnded, "start", at(start), "end", at(end), "worked", true, "done", done, "error", err)
	}
	const ms = time.Millisecond
	good := func() []map[string]any {
		return []map[string]any{
			line(-900*ms, reconcileWorking), line(-800*ms, reconcileWorking),
			line(0, stepStopBegan, "sinceStop", "0s"), line(ms, stepDraining, "sinceStop", "1ms"),
			line(100*ms, ownWriteAdmitted), ended(-900*ms, 110*ms, true, ""),
			line(200*ms, ownWriteAdmitted), ended(-800*ms, 210*ms, true, ""),
			line(211*ms, stepReturned, "sinceStop", "211ms"),
			line(212*ms, stepWebhookStopped, "sinceStop", "212ms"),
		}
	}
	measure := func(es []map[string]any) *singleResult {
		res := &singleResult{Mode: modeQuiesce, Objects: 2, SignalAt: t0.Add(-ms), ExitAfter: 300 * ms}
		res.measure(es, nil)
		return res
	}
	res := measure(good())
	if err := res.check(); err != nil {
		t.Errorf("check(good) = %v, want nil", err)
	}
	if res.InFlight != 2 || res.Finished != 2 || res.OwnWrites != 2 || res.OwnWritesInDrain != 2 || res.CutOff != 0 {
		t.Errorf("measure(good) = in flight %d, finished %d, own writes %d (%d in the drain), cut off %d; want 2, 2, 2 (2), 0",
			res.InFlight, res.Finished, res.OwnWrites, res.OwnWritesInDrain, res.CutOff)
	}
	for name, f := range map[string]func(es []map[string]any) []map[string]any{
		"a reconcile cut off": func(es []map[string]any) []map[string]any {
			es[7] = ended(-800*ms, 5*ms, false, "context canceled")
			return slices.Delete(es, 6, 7)
		},
		"a write after the drain": func(es []map[string]any) []map[string]any {
			es[6] = line(300*ms, ownWriteAdmitted)
			return es
		},
		"webhook stopped before the drain's end": func(es []map[string]any) []map[string]any {
			es[9]["sinceStop"] = "2ms"
			return es
		},
		"nothing in flight": func(es []map[string]any) []map[string]any {
			return slices.DeleteFunc(es, func(e map[string]any) bool {
				return e["msg"] == reconcileEnded || e["msg"] == ownWriteAdmitted
			})
		},
	} {
		err := measure(f(good())).check()
		if err == nil {
			t.Errorf("check(%s) = nil, want an error", name)
			continue
		}
		t.Logf("check(%s) = %v", name, err)
	}
}
