package shutdowntest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/quiesce-dev/quiesce/runnable"
	"github.com/quiesce-dev/quiesce/shutdowntest/internal/logline"
)

// Result is what happened when Stop stopped the operator.
type Result struct {
	// ExitCode is the operator's exit code; -1 when a signal ended it (SIGKILL).
	ExitCode int
	// Took is the time from the first SIGTERM to the exit.
	Took time.Duration
	// Killed is set when the operator did not exit within StopTimeout (or Stop's context
	// ended first): the harness sent a second SIGTERM, then SIGKILL if needed.
	Killed bool
	// Lines is the operator's whole log, stdout and stderr, one string per line.
	Lines []string
	// Abandoned, AbandonedCount, Timeline, Cut, Unfinished and GaveUp read the log in any of
	// the formats controller-runtime operators write: controller-runtime's zap logger, console
	// (development mode) or JSON, log/slog's text or JSON handler through
	// logr.FromSlogHandler, and logrus' text or JSON formatter through bombsimon/logrusr. When
	// the harness can read none of the log's lines, Stop says so.

	// Abandoned are the names of the calls in quiesce's runnable.AbandonedMessage line: the calls
	// still running at the end of the grace period, oldest first (quiesce lists up to 20 by
	// name; AbandonedCount counts them all). Empty when nothing was abandoned.
	Abandoned []string
	// AbandonedCount is how many calls quiesce abandoned: the largest "abandoned" field of
	// the log's runnable.AbandonedMessage lines (a line the operator writes later cannot
	// lower it). Abandoned are the names of that line.
	AbandonedCount int
	// Timeline is quiesce's stop, step by step: its lines that carry sinceStop ("Stop
	// began", "Shutdown delay over", "Draining executor", each report "Waiting for pending
	// calls", "All calls returned" or runnable.AbandonedMessage, "Webhook server stopped"), in order.
	// Lines quiesce logs at V(1) (a stop that waits for nothing) are here only when the
	// operator logs V(1).
	Timeline []Step
	// GaveUp is set when a line logged after SIGTERM has an error that begins with GaveUpText
	// (alone, or as the last error of the aggregate Manager.Start returns when a runnable
	// failed too), as a main that logs Start's error writes it: controller-runtime's manager
	// stopped waiting for its runnables at the end of its GracefulShutdownTimeout, with
	// reconciles (or other runnables) still running; their work is lost when the process
	// exits. A line that merely quotes the text elsewhere does not set it.
	GaveUp bool

	signaled int   // how many of Lines the harness had read when it sent SIGTERM
	logErr   error // logError(Lines): Stop returns it, HaveExitedGracefully fails with it
}

// GaveUpText is in the error controller-runtime's Manager.Start returns when its runnables
// did not all return within its GracefulShutdownTimeout (a main logs it, then exits).
const GaveUpText = "failed waiting for all runnables to end within grace period"

// gaveUp says whether a line of r.Lines after SIGTERM has an error that begins with
// GaveUpText, or an aggregate error ("[err, stopErr]", k8s.io/apimachinery's
// utilerrors.Aggregate) whose last error does.
func (r *Result) gaveUp() bool {
	return slices.ContainsFunc(r.Lines[min(r.signaled, len(r.Lines)):], func(l string) bool {
		if !strings.Contains(l, GaveUpText) {
			return false
		}
		e, ok := logline.Parse(l)
		err := e.Error()
		return ok && (strings.HasPrefix(err, GaveUpText) ||
			(strings.HasPrefix(err, "[") && strings.HasSuffix(err, "]") && strings.Contains(err, ", "+GaveUpText)))
	})
}

// Reconcile is one reconcile as controller-runtime's log shows it: its keys on the
// "Reconciler error" line (logged at every verbosity) or the "Reconciling" line (V(5)).
type Reconcile struct {
	Controller  string `json:"controller"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	ReconcileID string `json:"reconcileID"`
	// Error is the "Reconciler error" line's error; "" in Unfinished.
	Error string `json:"error"`
}

// String is "controller namespace/name: error".
func (r Reconcile) String() string {
	s := r.Controller + " " + r.Name
	if r.Namespace != "" {
		s = r.Controller + " " + r.Namespace + "/" + r.Name
	}
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

// Cut returns the reconciles that SIGTERM cut: controller-runtime's "Reconciler error"
// lines logged after it whose error says "context canceled" or "context deadline
// exceeded", in the log's order. It reads the log only, so it works on any operator,
// quiesce or not: run it on the operator before adopting quiesce to see what a stop loses
// (docs/adoption.md, "What would a stop lose?"). A reconcile that ignores its context is
// not cut but unfinished (Unfinished). The error is the line's "error" (zap) or "err"
// (slog, through logr.FromSlogHandler).
func (r *Result) Cut() []Reconcile {
	var cut []Reconcile
	for _, line := range r.Lines[min(r.signaled, len(r.Lines)):] {
		if rec, ok := reconcileLine(line, "Reconciler error"); ok &&
			(strings.Contains(rec.Error, "context canceled") || strings.Contains(rec.Error, "context deadline exceeded")) {
			cut = append(cut, rec)
		}
	}
	return cut
}

// Unfinished returns the reconciles that began and never ended before the operator exited:
// a "Reconciling" line and no "Reconciler error", "Reconcile successful" or "Reconcile
// done, ..." line with its reconcileID. controller-runtime logs these lines at V(5) only:
// run the operator with --zap-log-level=5 (kubebuilder's main binds the zap flags), or,
// under slog, a handler whose level is -5 or below; otherwise Unfinished is empty.
func (r *Result) Unfinished() []Reconcile {
	var began []Reconcile
	ended := map[string]bool{}
	for _, line := range r.Lines {
		if rec, ok := reconcileLine(line, "Reconciling"); ok {
			began = append(began, rec)
			continue
		}
		for _, msg := range []string{"Reconciler error", "Reconcile successful", "Reconcile done, requeueing"} {
			if rec, ok := reconcileLine(line, msg); ok {
				ended[rec.ReconcileID] = true
			}
		}
	}
	var unfinished []Reconcile
	for _, rec := range began {
		if rec.ReconcileID != "" && !ended[rec.ReconcileID] {
			unfinished = append(unfinished, rec)
		}
	}
	return unfinished
}

// reconcileLine reads line as controller-runtime's line msg about a reconcile (or a message
// that starts with msg and a space, as "Reconcile done, requeueing after 5s").
func reconcileLine(line, msg string) (Reconcile, bool) {
	if !strings.Contains(line, msg) {
		return Reconcile{}, false
	}
	e, ok := logline.Parse(line)
	if !ok || (e.Msg != msg && !strings.HasPrefix(e.Msg, msg+" ")) {
		return Reconcile{}, false
	}
	return Reconcile{Controller: e.String("controller"), Namespace: e.String("namespace"), Name: e.String("name"),
		ReconcileID: e.UID("reconcileID"), Error: e.Error()}, true
}

// Step is one line of quiesce's stop timeline.
type Step struct {
	// Message is the line's constant message, e.g. "Draining executor".
	Message string
	// SinceStop is the time from SIGTERM to the line, as quiesce logs it, e.g. "1.994s".
	SinceStop string
}

// timeline returns the lines of lines that carry sinceStop, in any format logline reads.
func timeline(lines []string) []Step {
	var steps []Step
	for _, line := range lines {
		if !strings.Contains(line, "sinceStop") {
			continue
		}
		if e, ok := logline.Parse(line); ok && e.String("sinceStop") != "" {
			steps = append(steps, Step{Message: e.Msg, SinceStop: e.String("sinceStop")})
		}
	}
	return steps
}

// goName finds the names in a list of calls that slog's text handler wrote with %+v
// ("[{Name:a Age:2s ...} {Name:b ...}]"), as it writes a value that is neither a
// slog.LogValuer nor an encoding.TextMarshaler.
var goName = regexp.MustCompile(`\{Name:(.*?) Age:`)

// abandoned finds quiesce's runnable.AbandonedMessage lines in lines and returns the names in
// the "calls" field and the "abandoned" count of the one with the largest count (the last of
// those with that count), in any format logline reads; the calls as JSON, or as slog's text
// handler writes Go values. A later line with a smaller count (a forged "abandoned: 0")
// lowers nothing.
func abandoned(lines []string) ([]string, int) {
	var names []string
	count := 0
	for _, line := range lines {
		if !strings.Contains(line, runnable.AbandonedMessage) {
			continue
		}
		e, ok := logline.Parse(line)
		if !ok || e.Msg != runnable.AbandonedMessage {
			continue
		}
		if n, ns := abandonedLine(e); n >= count {
			names, count = ns, n
		}
	}
	return names, count
}

// abandonedLine returns the "abandoned" count of a runnable.AbandonedMessage line (at least
// the names it lists) and the names in its "calls".
func abandonedLine(e logline.Entry) (int, []string) {
	var count int
	e.Decode("abandoned", &count)
	var calls []struct {
		Name string `json:"name"`
	}
	var names []string
	if e.Decode("calls", &calls) {
		for _, c := range calls {
			names = append(names, c.Name)
		}
	} else {
		for _, m := range goName.FindAllStringSubmatch(e.String("calls"), -1) {
			names = append(names, m[1])
		}
	}
	return max(count, len(names)), names
}

// readFormats says what the harness reads, in errors.
const readFormats = "controller-runtime's zap logger (log/zap), console or JSON, log/slog's text or " +
	"JSON handler through logr.FromSlogHandler, and logrus' text or JSON formatter through bombsimon/logrusr"

// logError returns nil when logline reads at least one of lines, and otherwise the error
// Stop returns: the Result's Timeline, Abandoned, Cut and Unfinished read nothing of such
// a log, and a test must not take their emptiness for a clean stop.
func logError(lines []string) error {
	if slices.ContainsFunc(lines, func(l string) bool { _, ok := logline.Parse(l); return ok }) {
		return nil
	}
	fix := "set the operator's logger, before it logs, to one it reads: " +
		"ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts))) (controller-runtime's log/zap, as kubebuilder's main does), " +
		"or ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil))) (or slog.NewJSONHandler), " +
		"or ctrl.SetLogger(logrusr.New(logger)) (a *logrus.Logger with its text or JSON formatter)"
	if len(lines) == 0 {
		return fmt.Errorf("failed to read the operator's log: it wrote no line, so Result.Timeline, Abandoned, "+
			"Cut and Unfinished are empty: %s", fix)
	}
	return fmt.Errorf("failed to read the operator's log: none of its %d lines is in a format shutdowntest "+
		"reads (%s), so Result.Timeline, Abandoned, Cut and Unfinished are empty: %s; its first lines:\n%s",
		len(lines), readFormats, fix, logExcerpt(lines[:min(len(lines), headLinesInErrors)]))
}

// readLines calls add with each line of r, without its end ("\n" or "\r\n"), until r fails
// or ends. A line longer than maxLineBytes is cut: its first maxLineBytes bytes, then
// " [... N bytes cut]"; the lines after it are read as any other.
func readLines(r io.Reader, add func(line string)) {
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	cut := 0
	for {
		chunk, err := br.ReadSlice('\n')
		end := err == nil
		if end {
			chunk = chunk[:len(chunk)-1]
		}
		n := min(len(chunk), maxLineBytes-len(line))
		line = append(line, chunk[:n]...)
		cut += len(chunk) - n
		if end || (!errors.Is(err, bufio.ErrBufferFull) && (len(line) > 0 || cut > 0)) {
			if cut > 0 {
				add(fmt.Sprintf("%s [... %d bytes cut]", line, cut))
			} else {
				add(string(bytes.TrimSuffix(line, []byte("\r"))))
			}
			line, cut = line[:0], 0
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return // io.EOF, or the read deadline readLog set
		}
	}
}
