package shutdowntest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/bombsimon/logrusr/v4"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/gomega"
	"github.com/sirupsen/logrus"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/runnable"
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

// emitStop writes, with l, what Cut, Unfinished, GaveUp, Timeline and Abandoned read:
// before SIGTERM three reconciles begin (V(5)); after it quiesce's stop, the reconcile c
// cut, a done, b never ends, one call abandoned and the manager gives up.
func emitStop(l logr.Logger, signal func()) {
	rec := func(name, id string) logr.Logger {
		// reconcileID a types.UID, as controller-runtime logs it.
		return l.WithName("controller").WithValues("controller", "demo", "namespace", "ns", "name", name,
			"reconcileID", types.UID(id))
	}
	for _, r := range []struct{ name, id string }{{"a", "1"}, {"b", "2"}, {"c", "3"}} {
		rec(r.name, r.id).V(5).Info("Reconciling")
	}
	signal()
	q := l.WithName("quiesce")
	q.Info("Stop began", "sinceStop", "0s", "shutdownDelay", "0s", "gracePeriod", "2s")
	q.Info("Draining executor", "gracePeriod", "2s", "sinceStop", "1ms", "pending", 2)
	rec("c", "3").Error(fmt.Errorf("failed to work: %w", context.Canceled), "Reconciler error")
	rec("a", "1").V(5).Info("Reconcile done, requeueing after 5s")
	q.Error(context.DeadlineExceeded, runnable.AbandonedMessage, "sinceStop", "2.001s", "abandoned", 2,
		"calls", internal.Entries{{Name: "demo/ns/b/export", Age: "2s", Where: "main.export (main.go:1)"},
			{Name: "demo/ns/b", Age: "2s"}})
	l.WithName("setup").Error(fmt.Errorf("%s of 3s: %w", GaveUpText, context.DeadlineExceeded), "Problem running manager")
}

// Every format the harness reads, as the loggers themselves write it.
func TestEachLogFormat(t *testing.T) {
	v5 := zap.Level(zapcore.Level(-5))
	slogV5 := &slog.HandlerOptions{Level: slog.Level(-5)}
	for _, tc := range []struct {
		name string
		log  func(w io.Writer) logr.Logger
	}{
		{"zap-console", func(w io.Writer) logr.Logger { return zap.New(zap.UseDevMode(true), zap.WriteTo(w), v5) }},
		{"zap-json", func(w io.Writer) logr.Logger { return zap.New(zap.WriteTo(w), v5) }},
		{"slog-text", func(w io.Writer) logr.Logger { return logr.FromSlogHandler(slog.NewTextHandler(w, slogV5)) }},
		{"slog-json", func(w io.Writer) logr.Logger { return logr.FromSlogHandler(slog.NewJSONHandler(w, slogV5)) }},
		{"logrus-text", func(w io.Writer) logr.Logger { return logrusr.New(logrusV5(w, &logrus.TextFormatter{})) }},
		{"logrus-json", func(w io.Writer) logr.Logger { return logrusr.New(logrusV5(w, &logrus.JSONFormatter{})) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			var buf bytes.Buffer
			signaled := 0
			emitStop(tc.log(&buf), func() { signaled = strings.Count(buf.String(), "\n") })
			r := &Result{Lines: strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n"), signaled: signaled}
			r.GaveUp = r.gaveUp()
			r.Abandoned, r.AbandonedCount = abandoned(r.Lines)
			r.Timeline = timeline(r.Lines)
			g.Expect(logError(r.Lines)).To(Succeed())
			g.Expect(r.Timeline).To(Equal([]Step{{"Stop began", "0s"}, {"Draining executor", "1ms"},
				{runnable.AbandonedMessage, "2.001s"}}))
			g.Expect(r.Abandoned).To(Equal([]string{"demo/ns/b/export", "demo/ns/b"}))
			g.Expect(r.AbandonedCount).To(Equal(2))
			g.Expect(r.Cut()).To(Equal([]Reconcile{{Controller: "demo", Namespace: "ns", Name: "c", ReconcileID: "3",
				Error: "failed to work: context canceled"}}))
			g.Expect(r.Unfinished()).To(Equal([]Reconcile{{Controller: "demo", Namespace: "ns", Name: "b", ReconcileID: "2"}}))
			g.Expect(r.GaveUp).To(BeTrue())
			g.Expect(r).NotTo(HaveExitedGracefully())
		})
	}
}

// logrusV5 is a logrus logger writing f to w at logr's V(5) (logrus' level 9, which logrusr
// maps V(5) to).
func logrusV5(w io.Writer, f logrus.Formatter) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetFormatter(f)
	l.SetLevel(logrus.Level(9))
	return l
}

// A log the harness cannot read: Stop's error names the formats it reads and how to set one.
func TestUnreadableLog(t *testing.T) {
	g := NewWithT(t)
	var buf bytes.Buffer
	emitStop(funcr.New(func(prefix, args string) { fmt.Fprintln(&buf, prefix, args) }, funcr.Options{Verbosity: 5}),
		func() {})
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	g.Expect(timeline(lines)).To(BeEmpty()) // what the check is for
	err := logError(lines)
	g.Expect(err).To(MatchError(And(
		ContainSubstring("failed to read the operator's log: none of its 9 lines is in a format shutdowntest reads"),
		ContainSubstring("zap logger (log/zap), console or JSON, log/slog's text or JSON handler"),
		ContainSubstring("and logrus' text or JSON formatter through bombsimon/logrusr"),
		ContainSubstring("ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))"),
		ContainSubstring(`"msg"="Reconciling"`), // its first lines
	)))
	g.Expect(logError(nil)).To(MatchError(ContainSubstring("it wrote no line")))
	g.Expect(logError(append(lines, "INFO\tAll calls returned"))).To(Succeed())

	// HaveExitedGracefully cannot tell: it fails with the error, whichever way it is used.
	r := &Result{Lines: lines, logErr: err}
	_, merr := HaveExitedGracefully().Match(r)
	g.Expect(merr).To(MatchError(err))
	r.ExitCode = 1
	ok, merr := HaveExitedGracefully().Match(r)
	g.Expect(ok, merr).To(BeFalse()) // exit code 1: not graceful, whatever the log says
}
