package shutdowntest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/quiesce-dev/quiesce/runnable"
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
	// Abandoned are the names of the calls in quiesce's runnable.AbandonedMessage line: the calls
	// still running at the end of the grace period, oldest first (quiesce lists up to 20 by
	// name; AbandonedCount counts them all). Empty when nothing was abandoned.
	Abandoned []string
	// AbandonedCount is how many calls quiesce abandoned (the line's "abandoned" field).
	AbandonedCount int
	// Timeline is quiesce's stop, step by step: its lines that carry sinceStop ("Stop
	// began", "Shutdown delay over", "Draining executor", each report "Waiting for pending
	// calls", "All calls returned" or runnable.AbandonedMessage, "Webhook server stopped"), in order.
	// Lines quiesce logs at V(1) (a stop that waits for nothing) are here only when the
	// operator logs V(1).
	Timeline []Step
	// GaveUp is set when the log holds GaveUpText: controller-runtime's manager stopped
	// waiting for its runnables at the end of its GracefulShutdownTimeout, with reconciles
	// (or other runnables) still running; their work is lost when the process exits.
	GaveUp bool

	signaled int // how many of Lines the harness had read when it sent SIGTERM
}

// GaveUpText is in the error controller-runtime's Manager.Start returns when its runnables
// did not all return within its GracefulShutdownTimeout (a main logs it, then exits).
const GaveUpText = "failed waiting for all runnables to end within grace period"

// gaveUp says whether r.Lines hold GaveUpText.
func (r *Result) gaveUp() bool {
	return slices.ContainsFunc(r.Lines, func(l string) bool { return strings.Contains(l, GaveUpText) })
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
// not cut but unfinished (Unfinished).
func (r *Result) Cut() []Reconcile {
	var cut []Reconcile
	for _, line := range r.Lines[min(r.signaled, len(r.Lines)):] {
		var rec Reconcile
		if logFields(line, "Reconciler error", &rec) &&
			(strings.Contains(rec.Error, "context canceled") || strings.Contains(rec.Error, "context deadline exceeded")) {
			cut = append(cut, rec)
		}
	}
	return cut
}

// Unfinished returns the reconciles that began and never ended before the operator exited:
// a "Reconciling" line and no "Reconciler error", "Reconcile successful" or "Reconcile
// done, ..." line with its reconcileID. controller-runtime logs these lines at V(5) only:
// run the operator with --zap-log-level=5 (kubebuilder's main binds the zap flags);
// otherwise Unfinished is empty.
func (r *Result) Unfinished() []Reconcile {
	var began []Reconcile
	ended := map[string]bool{}
	for _, line := range r.Lines {
		var rec Reconcile
		switch {
		case logFields(line, "Reconciling", &rec):
			began = append(began, rec)
		case logFields(line, "Reconciler error", &rec),
			logFields(line, "Reconcile successful", &rec), logFields(line, "Reconcile done, requeueing", &rec):
			ended[rec.ReconcileID] = true
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

// logFields decodes into v the key/values of line when its message is msg (or starts with
// msg and a space, as "Reconcile done, requeueing after 5s"): a JSON object (production mode) or console text
// "...\tmsg\t{...}" (development mode).
func logFields(line, msg string, v any) bool {
	if !strings.Contains(line, msg) {
		return false
	}
	var m struct {
		Msg string `json:"msg"`
	}
	if decodeJSON(line, &m) {
		return (m.Msg == msg || strings.HasPrefix(m.Msg, msg+" ")) && decodeJSON(line, v)
	}
	parts := strings.Split(line, "\t")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == msg || strings.HasPrefix(parts[i], msg+" ") {
			return decodeJSON(parts[i+1], v)
		}
	}
	return false
}

// Step is one line of quiesce's stop timeline.
type Step struct {
	// Message is the line's constant message, e.g. "Draining executor".
	Message string
	// SinceStop is the time from SIGTERM to the line, as quiesce logs it, e.g. "1.994s".
	SinceStop string
}

// timeline returns the lines of lines that carry sinceStop, read as abandoned reads them: a
// JSON object (production mode) or console text whose last tab-separated field is one.
func timeline(lines []string) []Step {
	var steps []Step
	for _, line := range lines {
		if !strings.Contains(line, `"sinceStop"`) {
			continue
		}
		var f struct {
			Msg       string `json:"msg"`
			SinceStop string `json:"sinceStop"`
		}
		if decodeJSON(line, &f) && f.SinceStop != "" {
			steps = append(steps, Step{Message: f.Msg, SinceStop: f.SinceStop})
			continue
		}
		parts := strings.Split(line, "\t")
		if n := len(parts); n >= 2 && decodeJSON(parts[n-1], &f) && f.SinceStop != "" {
			steps = append(steps, Step{Message: parts[n-2], SinceStop: f.SinceStop})
		}
	}
	return steps
}

// abandoned finds quiesce's runnable.AbandonedMessage line in lines and returns the names in its
// "calls" field and its "abandoned" count. controller-runtime's zap logger writes a line
// either as one JSON object (production mode) or, in development mode (kubebuilder's
// default), as console text whose key/values are a JSON object after the message; both are
// read as JSON. The last such line counts.
func abandoned(lines []string) ([]string, int) {
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		at := strings.Index(line, runnable.AbandonedMessage)
		if at < 0 {
			continue
		}
		var fields struct {
			Abandoned int `json:"abandoned"`
			Calls     []struct {
				Name string `json:"name"`
			} `json:"calls"`
		}
		if !decodeJSON(line, &fields) {
			rest := line[at+len(runnable.AbandonedMessage):]
			j := strings.Index(rest, "{")
			if j < 0 || !decodeJSON(rest[j:], &fields) {
				continue
			}
		}
		names := make([]string, 0, len(fields.Calls))
		for _, c := range fields.Calls {
			names = append(names, c.Name)
		}
		return names, max(fields.Abandoned, len(names))
	}
	return nil, 0
}

// decodeJSON decodes the JSON object at the start of s into v (ignoring what follows it).
func decodeJSON(s string, v any) bool {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") {
		return false
	}
	return json.NewDecoder(strings.NewReader(s)).Decode(v) == nil
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
