package main

import (
	"bufio"
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
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

// TestDemo runs `make demo`'s scenario end to end: it builds the operator, runs it against
// a real control plane, sends it SIGTERM while handlers run, and checks its log and exit
// code. Short durations keep it to a few seconds beyond the build.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo starts a control plane and builds a binary: skipped with -short")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	blocked := "main.(*legacyClient).Export (controller.go:" + strconv.Itoa(sourceLine(t, "../demo-operator/controller.go", "blocks here")) + ")"
	working := "main.(*ConfigMapReconciler).snapshot (controller.go:" + strconv.Itoa(sourceLine(t, "../demo-operator/controller.go", "the snapshot works here")) + ")"

	t.Run("a handler hangs", func(t *testing.T) { testHandlerHangs(t, blocked, working) })
	t.Run("every handler finishes", testEveryHandlerFinishes)
	t.Run("a second SIGTERM exits at once", testSecondSIGTERM)
}

// testHandlerHangs: the reports and the abandoned line name the hanging handler at blocked,
// the first report the working ones at working; the operator exits 1 after the grace period.
func testHandlerHangs(t *testing.T, blocked, working string) {
	res := runDemo(t, config{GracePeriod: 3 * time.Second, Work: 2 * time.Second, CancelAfter: 2500 * time.Millisecond, Objects: 3, Hanging: 1})

	if res.ExitCode != 1 {
		t.Errorf("operator exit code = %d, want 1", res.ExitCode)
	}
	if err := res.check(); err != nil {
		t.Errorf("check() = %v, want nil", err)
	}
	// The reports name the hanging handler and the line where it blocks.
	reports := grep(res.Lines, "Waiting for pending calls")
	if len(reports) == 0 {
		t.Errorf("no report of pending calls in the operator's log")
	}
	for _, l := range reports {
		if !strings.Contains(l, `"name":"demo/demo/hang-1/legacy-export"`) || !strings.Contains(l, blocked) {
			t.Errorf("report does not name demo/demo/hang-1/legacy-export at %s:\n%s", blocked, l)
		}
	}
	// The first report, 1s after SIGTERM, comes while the snapshots still run (they take
	// 2s from just before SIGTERM): it names them too, and where they work.
	if len(reports) > 0 && (!strings.Contains(reports[0], `"name":"demo/demo/job-1/snapshot"`) || !strings.Contains(reports[0], working)) {
		t.Errorf("first report does not name demo/demo/job-1/snapshot at %s:\n%s", working, reports[0])
	}
	// The finishing handlers finished.
	for _, name := range []string{"job-1", "job-2"} {
		if got := grep(grep(grep(res.Lines, "Handler finished"), `"name": "`+name+`"`), `"handler": "snapshot"`); len(got) != 1 {
			t.Errorf("want one %q line for %s, got %d", "Handler finished", name, len(got))
		}
	}
	// The runnable names what it abandons, where it blocks, and main exits 1 saying why.
	abandoned := grep(res.Lines, "Abandoned calls still running after the grace period")
	if len(abandoned) != 1 || !strings.Contains(abandoned[0], `"demo/demo/hang-1/legacy-export at `+blocked+`"`) {
		t.Errorf("want one abandoned line naming demo/demo/hang-1/legacy-export at %s, got %q", blocked, abandoned)
	}
	if got := grep(res.Lines, `"exitCode": 1`); len(got) != 1 {
		t.Errorf("want one line saying exitCode 1, got %q", got)
	}
	// The grace period bounds the drain, and the operator exits right after it.
	if res.ExitAfter < 3*time.Second || res.ExitAfter > 3*time.Second+5*time.Second {
		t.Errorf("the operator exited %s after SIGTERM, want 3s, the grace period, and a bit", res.ExitAfter)
	}
}

// testEveryHandlerFinishes: without a hanging handler the operator exits 0 once the
// handlers finished, before the grace period ends.
func testEveryHandlerFinishes(t *testing.T) {
	res := runDemo(t, config{GracePeriod: 3 * time.Second, Work: time.Second, CancelAfter: 2 * time.Second, Objects: 2, Hanging: 0})

	if res.ExitCode != 0 {
		t.Errorf("operator exit code = %d, want 0", res.ExitCode)
	}
	if err := res.check(); err != nil {
		t.Errorf("check() = %v, want nil", err)
	}
	for _, msg := range []string{"Abandoned calls", "legacy-export"} {
		if got := grep(res.Lines, msg); len(got) != 0 {
			t.Errorf("want no line saying %q, got %q", msg, got)
		}
	}
	if got := grep(res.Lines, "Handler finished"); len(got) != 2 {
		t.Errorf("want 2 %q lines, got %d", "Handler finished", len(got))
	}
	for _, msg := range []string{"All calls returned", `"exitCode": 0`} {
		if got := grep(res.Lines, msg); len(got) != 1 {
			t.Errorf("want one line saying %q, got %q", msg, got)
		}
	}
	if res.ExitAfter > 3*time.Second {
		t.Errorf("the operator exited %s after SIGTERM, want it to exit once the snapshots finished, before the grace period (3s) ends", res.ExitAfter)
	}
}

// testSecondSIGTERM: a second SIGTERM ends the drain at once, with exit code 1.
func testSecondSIGTERM(t *testing.T) {
	res := runDemo(t, config{GracePeriod: time.Minute, Work: 20 * time.Second, CancelAfter: 40 * time.Second, Objects: 2, Hanging: 1, SecondSignal: time.Second})

	if !res.Second || res.ExitCode != 1 {
		t.Errorf("second SIGTERM sent: %v, operator exit code = %d; want true, 1", res.Second, res.ExitCode)
	}
	if err := res.check(); err != nil {
		t.Errorf("check() = %v, want nil", err)
	}
	if res.ExitAfter > 10*time.Second {
		t.Errorf("the operator exited %s after the first SIGTERM, want about 1s, at the second one", res.ExitAfter)
	}
	for _, msg := range []string{"Abandoned calls", "Handler finished", "Exiting"} {
		if got := grep(res.Lines, msg); len(got) != 0 {
			t.Errorf("want no line saying %q, got %q", msg, got)
		}
	}
}

// TestREADMEMatchesSource keeps examples/README.md's captured run honest: every
// controller.go line it shows is still one of the lines the reports name.
func TestREADMEMatchesSource(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const src = "../demo-operator/controller.go"
	valid := map[string]bool{}
	for _, marker := range []string{"blocks here", "the snapshot works here", "reconcilers.Call(ctx"} {
		valid["controller.go:"+strconv.Itoa(sourceLine(t, src, marker))] = true
	}
	found := regexp.MustCompile(`controller\.go:\d+`).FindAllString(string(b), -1)
	if len(found) == 0 {
		t.Fatal("README.md shows no controller.go line")
	}
	for _, f := range found {
		if !valid[f] {
			t.Errorf("README.md shows %s, which is none of the lines the demo's reports name (%v): capture `make demo` again", f, valid)
		}
	}
}

// runDemo runs the scenario, the operator built with -race when the test is, and logs the
// demo's output if the test fails.
func runDemo(t *testing.T, cfg config) result {
	t.Helper()
	var out bytes.Buffer
	cfg.Out = &out
	if raceEnabled {
		cfg.BuildFlags = []string{"-race"}
	}
	start := time.Now()
	res, err := run(t.Context(), cfg)
	t.Logf("the demo took %s", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the demo's output:\n%s", out.String())
		}
	})
	if err != nil {
		t.Fatalf("run() = %v", err)
	}
	return res
}

// sourceLine returns the number of the only line of file containing marker.
func sourceLine(t *testing.T, file, marker string) int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only: nothing to lose
	found := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if strings.Contains(sc.Text(), marker) {
			if found != 0 {
				t.Fatalf("%s: marker %q on lines %d and %d", file, marker, found, n)
			}
			found = n
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatalf("%s: no line contains %q", file, marker)
	}
	return found
}

func grep(lines []string, substr string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}
