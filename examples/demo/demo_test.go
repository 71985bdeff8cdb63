package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/shutdowntest"
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if err := shutdowntest.Cleanup(); err != nil { // the operator binary the runs share
			fmt.Fprintln(os.Stderr, err)
			code = max(code, 1)
		}
		os.Exit(code)
	}))
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
	lines := sourceLines{
		blocked: "main.(*legacyClient).Export (controller.go:" + strconv.Itoa(sourceLine(t, "blocks here")) + ")",
		working: "main.(*ConfigMapReconciler).snapshot (controller.go:" + strconv.Itoa(sourceLine(t, "the snapshot works here")) + ")",
		// The function given to reconcilers.Call: the handler calls' own frame.
		handler: "(controller.go:" + strconv.Itoa(sourceLine(t, handlerMarker)) + ")",
	}

	t.Run("a handler hangs", func(t *testing.T) { testHandlerHangs(t, lines) })
	t.Run("every handler finishes", func(t *testing.T) { testEveryHandlerFinishes(t, lines) })
	t.Run("a second SIGTERM exits at once", func(t *testing.T) { testSecondSIGTERM(t, lines) })
}

// handlerMarker is on the line of controller.go where the function given to
// reconcilers.Call calls the handler: the "handler" of the handler calls.
const handlerMarker = `logger.Info("Handler started"); return fn(ctx)`

// sourceLines are the lines of the demo operator that its log names.
type sourceLines struct {
	blocked string // where legacy-export blocks: "main.(*legacyClient).Export (controller.go:N)"
	working string // where snapshot works: "main.(*ConfigMapReconciler).snapshot (controller.go:N)"
	handler string // the end of the handler calls' handler: "(controller.go:N)"
}

// testHandlerHangs: /debug/quiesce lists every call before SIGTERM; the reports and the
// abandoned line name the hanging handler where it blocks and its handler line, the first
// report the working ones where they work; the operator exits 1 after the grace period.
func testHandlerHangs(t *testing.T, lines sourceLines) {
	cfg := config{GracePeriod: 3 * time.Second, Work: 2 * time.Second, CancelAfter: 2500 * time.Millisecond, Objects: 3, Hanging: 1}
	res := runDemo(t, cfg)

	if res.ExitCode != 1 {
		t.Errorf("operator exit code = %d, want 1", res.ExitCode)
	}
	if err := res.check(); err != nil {
		t.Errorf("check() = %v, want nil", err)
	}
	checkDebug(t, res, cfg.Objects, lines)

	// The reports name the hanging handler, the line where it blocks, and its handler.
	reports := grep(res.Lines, "Waiting for pending calls")
	if len(reports) == 0 {
		t.Errorf("no report of pending calls in the operator's log")
	}
	for _, l := range reports {
		c, ok := findCall(logCalls(t, l), "demo/demo/hang-1/legacy-export")
		if !ok || c.Where != lines.blocked || !strings.HasSuffix(c.Handler, lines.handler) {
			t.Errorf("report does not name demo/demo/hang-1/legacy-export at %s, handler at %s:\n%s", lines.blocked, lines.handler, l)
		}
	}
	// The first report, 1s after SIGTERM, comes while the snapshots still run (they take
	// 2s from just before SIGTERM): it names them too, and where they work.
	if len(reports) > 0 {
		if c, ok := findCall(logCalls(t, reports[0]), "demo/demo/job-1/snapshot"); !ok || c.Where != lines.working {
			t.Errorf("first report does not name demo/demo/job-1/snapshot at %s:\n%s", lines.working, reports[0])
		}
	}
	// The finishing handlers finished.
	for _, name := range []string{"job-1", "job-2"} {
		if got := grep(grep(grep(res.Lines, "Handler finished"), `"name": "`+name+`"`), `"handler": "snapshot"`); len(got) != 1 {
			t.Errorf("want one %q line for %s, got %d", "Handler finished", name, len(got))
		}
	}
	// The runnable names what it abandons, in the reports' format, and main exits 1.
	abandoned := grep(res.Lines, "Abandoned calls still running after the grace period")
	if len(abandoned) != 1 {
		t.Errorf("want one abandoned line, got %q", abandoned)
	} else {
		f := logFields(t, abandoned[0])
		want := call{Name: "demo/demo/hang-1/legacy-export", Detached: true, Where: lines.blocked}
		if len(f.Calls) != 1 || f.Abandoned != 1 {
			t.Errorf("want the abandoned line to count and list 1 call, got %d, %+v:\n%s", f.Abandoned, f.Calls, abandoned[0])
		} else if c := f.Calls[0]; c.Name != want.Name || c.Detached != want.Detached || c.Where != want.Where ||
			!strings.HasSuffix(c.Handler, lines.handler) || c.Age == "" {
			t.Errorf("abandoned call = %+v, want %+v with an age and its handler at %s", c, want, lines.handler)
		}
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
func testEveryHandlerFinishes(t *testing.T, lines sourceLines) {
	cfg := config{GracePeriod: 3 * time.Second, Work: time.Second, CancelAfter: 2 * time.Second, Objects: 2, Hanging: 0}
	res := runDemo(t, cfg)

	if res.ExitCode != 0 {
		t.Errorf("operator exit code = %d, want 0", res.ExitCode)
	}
	if err := res.check(); err != nil {
		t.Errorf("check() = %v, want nil", err)
	}
	checkDebug(t, res, cfg.Objects, lines)
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
func testSecondSIGTERM(t *testing.T, lines sourceLines) {
	cfg := config{GracePeriod: time.Minute, Work: 20 * time.Second, CancelAfter: 40 * time.Second, Objects: 2, Hanging: 1, SecondSignal: time.Second}
	res := runDemo(t, cfg)

	if !res.Second || res.ExitCode != 1 {
		t.Errorf("second SIGTERM sent: %v, operator exit code = %d; want true, 1", res.Second, res.ExitCode)
	}
	if err := res.check(); err != nil {
		t.Errorf("check() = %v, want nil", err)
	}
	checkDebug(t, res, cfg.Objects, lines)
	if res.ExitAfter > 10*time.Second {
		t.Errorf("the operator exited %s after the first SIGTERM, want about 1s, at the second one", res.ExitAfter)
	}
	for _, msg := range []string{"Abandoned calls", "Handler finished", "Exiting"} {
		if got := grep(res.Lines, msg); len(got) != 0 {
			t.Errorf("want no line saying %q, got %q", msg, got)
		}
	}
}

// TestREADMEMatchesSource keeps the captured runs honest (examples/README.md, the
// module's README.md and docs/operating.md): every controller.go line they show is still
// one of the lines the reports name.
func TestREADMEMatchesSource(t *testing.T) {
	valid := map[string]bool{}
	for _, marker := range []string{"blocks here", "the snapshot works here", "reconcilers.Call(ctx", handlerMarker} {
		valid["controller.go:"+strconv.Itoa(sourceLine(t, marker))] = true
	}
	for _, doc := range []string{"../README.md", "../../README.md", "../../docs/operating.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		found := regexp.MustCompile(`\bcontroller\.go:\d+`).FindAllString(string(b), -1)
		if len(found) == 0 {
			t.Errorf("%s shows no controller.go line", doc)
		}
		for _, f := range found {
			if !valid[f] {
				t.Errorf("%s shows %s, which is none of the lines the demo's reports name (%v): capture `make demo` again", doc, f, valid)
			}
		}
	}
}

// checkDebug checks the body of /debug/quiesce, fetched while the handlers of objects
// ConfigMaps ran: not draining, each reconcile and its handler call listed, each with where
// it waits and its handler, the reconcile's Reconcile and the handler's function in
// controller.go (lines.handler).
func checkDebug(t *testing.T, res result, objects int, lines sourceLines) {
	t.Helper()
	var body struct {
		Draining bool   `json:"draining"`
		Count    int    `json:"count"`
		Calls    []call `json:"calls"`
	}
	if err := json.Unmarshal(res.Debug, &body); err != nil {
		t.Errorf("/debug/quiesce: %v:\n%s", err, res.Debug)
		return
	}
	if body.Draining || body.Count != 2*objects || len(body.Calls) != 2*objects {
		t.Errorf("/debug/quiesce: draining %v, count %d, %d calls; want false, and %d: a reconcile and a handler call per ConfigMap:\n%s",
			body.Draining, body.Count, len(body.Calls), 2*objects, res.Debug)
	}
	handlers := map[string]string{}
	for _, name := range res.Finishing {
		handlers[name] = "snapshot"
	}
	for _, name := range res.Hanging {
		handlers[name] = "legacy-export"
	}
	if len(handlers) != objects {
		t.Errorf("the demo created %d ConfigMaps, want %d", len(handlers), objects)
	}
	for cm, handler := range handlers {
		reconcile := "demo/" + namespace + "/" + cm
		for _, name := range []string{reconcile, reconcile + "/" + handler} {
			c, ok := findCall(body.Calls, name)
			switch {
			case !ok:
				t.Errorf("/debug/quiesce does not list %s:\n%s", name, res.Debug)
			case c.Where == "" || c.Where == drain.Unknown || c.Handler == "" || c.Handler == drain.Unknown:
				t.Errorf("/debug/quiesce: %s: where %q, handler %q; want both known", name, c.Where, c.Handler)
			case name == reconcile && !strings.HasPrefix(c.Handler, "main.(*ConfigMapReconciler).Reconcile ("):
				t.Errorf("/debug/quiesce: %s: handler %q, want main.(*ConfigMapReconciler).Reconcile", name, c.Handler)
			case name != reconcile && !strings.HasSuffix(c.Handler, lines.handler):
				t.Errorf("/debug/quiesce: %s: handler %q, want the function given to reconcilers.Call, at %s", name, c.Handler, lines.handler)
			}
		}
	}
}

// call is a pending call as /debug/quiesce and the abandoned line show it.
type call struct {
	Name     string `json:"name"`
	Age      string `json:"age"`
	Detached bool   `json:"detached"`
	Where    string `json:"where"`
	Handler  string `json:"handler"`
}

func findCall(calls []call, name string) (call, bool) {
	for _, c := range calls {
		if c.Name == name {
			return c, true
		}
	}
	return call{}, false
}

// fields are the key/values of a quiesce log line that lists calls.
type fields struct {
	Pending   int    `json:"pending"`
	Abandoned int    `json:"abandoned"`
	Calls     []call `json:"calls"`
}

// logFields decodes the key/values of a line of the operator's log: zap's development
// encoder writes them as a JSON object, the line's last tab-separated field.
func logFields(t *testing.T, line string) fields {
	t.Helper()
	var f fields
	i := strings.LastIndexByte(line, '\t')
	if err := json.Unmarshal([]byte(line[i+1:]), &f); err != nil {
		t.Errorf("failed to decode the key/values of a log line: %v:\n%s", err, line)
	}
	return f
}

func logCalls(t *testing.T, line string) []call {
	t.Helper()
	return logFields(t, line).Calls
}

// runDemo runs the scenario, the operator built with -race when the test is, and logs the
// demo's output if the test fails.
func runDemo(t *testing.T, cfg config) result {
	t.Helper()
	var out bytes.Buffer
	cfg.Out = &out
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

// controllerSource is the demo operator's controller.go, whose lines its log names.
const controllerSource = "../demo-operator/controller.go"

// sourceLine returns the number of the only line of controllerSource containing marker.
func sourceLine(t *testing.T, marker string) int {
	t.Helper()
	file := controllerSource
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
