package logline

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/bombsimon/logrusr/v4"
	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/sirupsen/logrus"
	"go.uber.org/goleak"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Lines written by each logger (see TestRealLoggers, which writes them again): quiesce's
// "Stop began" and abandoned line, controller-runtime's V(5) "Reconciling" and its
// "Reconciler error" (its reconcileID a types.UID, which logrusr writes as JSON).
var fixtures = map[Format][]string{
	ZapConsole: {
		"2026-12-04T14:12:39Z\tINFO\tquiesce\tStop began\t{\"sinceStop\": \"0s\", \"gracePeriod\": \"2s\"}",
		"2026-12-04T14:12:39Z\tERROR\tquiesce\tAbandoned calls still running after the grace period\t" +
			`{"sinceStop": "2.007s", "abandoned": 1, "calls": [{"name":"demo/ns/a/export","age":"2s"}], "error": "context deadline exceeded"}`,
		"2026-12-04T14:12:39Z\tLEVEL(-5)\tReconciling\t" +
			`{"controller": "demo", "namespace": "ns", "name": "a", "reconcileID": "id-1"}`,
		"2026-12-04T14:12:39Z\tERROR\tReconciler error\t" +
			`{"controller": "demo", "namespace": "ns", "name": "a", "reconcileID": "id-1", "error": "failed to work: context canceled"}`,
	},
	ZapJSON: {
		`{"level":"info","ts":"2026-12-04T14:12:39Z","logger":"quiesce","msg":"Stop began","sinceStop":"0s","gracePeriod":"2s"}`,
		`{"level":"error","ts":"2026-12-04T14:12:39Z","logger":"quiesce","msg":"Abandoned calls still running after the grace period",` +
			`"sinceStop":"2.007s","abandoned":1,"calls":[{"name":"demo/ns/a/export","age":"2s"}],"error":"context deadline exceeded",` +
			`"stacktrace":"main.main\n\t/src/main.go:22"}`,
		`{"level":"Level(-5)","ts":"2026-12-04T14:12:39Z","msg":"Reconciling","controller":"demo","namespace":"ns","name":"a","reconcileID":"id-1"}`,
		`{"level":"error","ts":"2026-12-04T14:12:39Z","msg":"Reconciler error","controller":"demo","namespace":"ns","name":"a",` +
			`"reconcileID":"id-1","error":"failed to work: context canceled","stacktrace":"main.main\n\t/src/main.go:26"}`,
	},
	SlogText: {
		`time=2026-12-04T14:12:39.862Z level=INFO msg="Stop began" logger=quiesce sinceStop=0s gracePeriod=2s`,
		`time=2026-12-04T14:12:39.862Z level=ERROR msg="Abandoned calls still running after the grace period" logger=quiesce ` +
			`err="context deadline exceeded" sinceStop=2.007s abandoned=1 calls="[{Name:demo/ns/a/export Age:2s}]"`,
		`time=2026-12-04T14:12:39.862Z level=DEBUG-1 msg=Reconciling controller=demo namespace=ns name=a reconcileID=id-1`,
		`time=2026-12-04T14:12:39.862Z level=ERROR msg="Reconciler error" controller=demo namespace=ns name=a ` +
			`reconcileID=id-1 err="failed to work: context canceled"`,
	},
	SlogJSON: {
		`{"time":"2026-12-04T14:12:39.862961916Z","level":"INFO","msg":"Stop began","logger":"quiesce","sinceStop":"0s","gracePeriod":"2s"}`,
		`{"time":"2026-12-04T14:12:39.862965532Z","level":"ERROR","msg":"Abandoned calls still running after the grace period",` +
			`"logger":"quiesce","err":"context deadline exceeded","sinceStop":"2.007s","abandoned":1,"calls":[{"name":"demo/ns/a/export","age":"2s"}]}`,
		`{"time":"2026-12-04T14:12:39.862972182Z","level":"DEBUG-1","msg":"Reconciling","controller":"demo","namespace":"ns","name":"a","reconcileID":"id-1"}`,
		`{"time":"2026-12-04T14:12:39.862974275Z","level":"ERROR","msg":"Reconciler error","controller":"demo","namespace":"ns",` +
			`"name":"a","reconcileID":"id-1","err":"failed to work: context canceled"}`,
	},
	LogrusText: {
		`time="2026-12-04T14:12:39Z" level=info msg="Stop began" gracePeriod=2s logger=quiesce sinceStop=0s`,
		`time="2026-12-04T14:12:39Z" level=error msg="Abandoned calls still running after the grace period" abandoned=1 ` +
			`calls="[{\"name\":\"demo/ns/a/export\",\"age\":\"2s\"}]" error="context deadline exceeded" logger=quiesce sinceStop=2.007s`,
		`time="2026-12-04T14:12:39Z" level=unknown msg=Reconciling controller=demo name=a namespace=ns reconcileID="\"id-1\""`,
		`time="2026-12-04T14:12:39Z" level=error msg="Reconciler error" controller=demo error="failed to work: context canceled" ` +
			`name=a namespace=ns reconcileID="\"id-1\""`,
	},
	LogrusJSON: {
		`{"gracePeriod":"2s","level":"info","logger":"quiesce","msg":"Stop began","sinceStop":"0s","time":"2026-12-04T14:12:39Z"}`,
		`{"abandoned":1,"calls":"[{\"name\":\"demo/ns/a/export\",\"age\":\"2s\"}]","error":"context deadline exceeded",` +
			`"level":"error","logger":"quiesce","msg":"Abandoned calls still running after the grace period","sinceStop":"2.007s",` +
			`"time":"2026-12-04T14:12:39Z"}`,
		`{"controller":"demo","level":"unknown","msg":"Reconciling","name":"a","namespace":"ns","reconcileID":"\"id-1\"","time":"2026-12-04T14:12:39Z"}`,
		`{"controller":"demo","error":"failed to work: context canceled","level":"error","msg":"Reconciler error","name":"a",` +
			`"namespace":"ns","reconcileID":"\"id-1\"","time":"2026-12-04T14:12:39Z"}`,
	},
}

// checkFixture checks the four lines of fixtures, as Parse reads them in format f.
func checkFixture(g Gomega, f Format, lines []string) {
	g.Expect(lines).To(HaveLen(4), "lines of %s", f)
	es := make([]Entry, 0, len(lines))
	for _, l := range lines {
		e, ok := Parse(l)
		g.Expect(ok).To(BeTrue(), "%s: %q", f, l)
		g.Expect(e.Format).To(Equal(f), "%q", l)
		es = append(es, e)
	}
	stop, abandoned, reconciling, failed := es[0], es[1], es[2], es[3]
	g.Expect(stop.Msg).To(Equal("Stop began"))
	g.Expect(stop.Logger).To(Equal("quiesce"))
	g.Expect(stop.String("sinceStop")).To(Equal("0s"))
	g.Expect(stop.String("gracePeriod")).To(Equal("2s"))
	g.Expect(stop.Has("error")).To(BeFalse())
	g.Expect(stop.String("nothing")).To(BeEmpty())

	g.Expect(abandoned.Msg).To(Equal("Abandoned calls still running after the grace period"))
	g.Expect(abandoned.Error()).To(Equal("context deadline exceeded"))
	g.Expect(abandoned.String("sinceStop")).To(Equal("2.007s"))
	var n int
	g.Expect(abandoned.Decode("abandoned", &n)).To(BeTrue())
	g.Expect(n).To(Equal(1))
	g.Expect(abandoned.String("abandoned")).To(Equal("1"))
	g.Expect(abandoned.String("calls")).To(ContainSubstring("demo/ns/a/export"))
	var calls []call
	if f != SlogText { // slog's text writes []call with %+v
		g.Expect(abandoned.Decode("calls", &calls)).To(BeTrue())
		g.Expect(calls).To(Equal([]call{{"demo/ns/a/export", "2s"}}))
	}

	g.Expect(reconciling.Msg).To(Equal("Reconciling"))
	g.Expect(reconciling.Level).To(BeElementOf("LEVEL(-5)", "Level(-5)", "DEBUG-1", "unknown"))
	g.Expect(failed.Msg).To(Equal("Reconciler error"))
	for _, e := range []Entry{reconciling, failed} {
		g.Expect(e.Logger).To(BeEmpty())
		g.Expect([]string{e.String("controller"), e.String("namespace"), e.String("name"), e.UID("reconcileID")}).
			To(Equal([]string{"demo", "ns", "a", "id-1"}))
	}
	g.Expect(failed.Error()).To(Equal("failed to work: context canceled"))
}

func TestFixtures(t *testing.T) {
	for f, lines := range fixtures {
		t.Run(string(f), func(t *testing.T) { checkFixture(NewWithT(t), f, lines) })
	}
}

type call struct {
	Name string `json:"name"`
	Age  string `json:"age"`
}

// emit writes the fixtures' four lines with l.
func emit(l logr.Logger) {
	q := l.WithName("quiesce")
	q.Info("Stop began", "sinceStop", "0s", "gracePeriod", "2s")
	q.Error(errors.New("context deadline exceeded"), "Abandoned calls still running after the grace period",
		"sinceStop", "2.007s", "abandoned", 1, "calls", []call{{"demo/ns/a/export", "2s"}})
	// reconcileID a types.UID, as controller-runtime logs it.
	c := l.WithValues("controller", "demo", "namespace", "ns", "name", "a", "reconcileID", types.UID("id-1"))
	c.V(5).Info("Reconciling")
	c.Error(errors.New("failed to work: context canceled"), "Reconciler error")
}

// The loggers themselves write what the fixtures hold, stack traces aside: zap's
// development mode writes them on lines of their own, which Parse does not read.
func TestRealLoggers(t *testing.T) {
	debug := zap.Level(zapcore.Level(-10))
	slogDebug := &slog.HandlerOptions{Level: slog.Level(-10)}
	for _, tc := range []struct {
		f   Format
		log func(w *bytes.Buffer) logr.Logger
	}{
		{ZapConsole, func(w *bytes.Buffer) logr.Logger { return zap.New(zap.UseDevMode(true), zap.WriteTo(w), debug) }},
		{ZapJSON, func(w *bytes.Buffer) logr.Logger { return zap.New(zap.WriteTo(w), debug) }},
		{SlogText, func(w *bytes.Buffer) logr.Logger { return logr.FromSlogHandler(slog.NewTextHandler(w, slogDebug)) }},
		{SlogJSON, func(w *bytes.Buffer) logr.Logger { return logr.FromSlogHandler(slog.NewJSONHandler(w, slogDebug)) }},
		{LogrusText, func(w *bytes.Buffer) logr.Logger { return logrusr.New(logrusDebug(w, &logrus.TextFormatter{})) }},
		{LogrusJSON, func(w *bytes.Buffer) logr.Logger { return logrusr.New(logrusDebug(w, &logrus.JSONFormatter{})) }},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			var buf bytes.Buffer
			emit(tc.log(&buf))
			var lines []string
			for l := range strings.Lines(buf.String()) {
				if _, ok := Parse(l); ok {
					lines = append(lines, l)
				}
			}
			checkFixture(NewWithT(t), tc.f, lines)
		})
	}
}

// logrusDebug is a logrus logger writing f to w at logr's V(5) (logrus' level 9).
func logrusDebug(w *bytes.Buffer, f logrus.Formatter) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetFormatter(f)
	l.SetLevel(logrus.Level(9))
	return l
}

func TestNotALogLine(t *testing.T) {
	for _, line := range []string{
		"",
		"stubborn: pid 12 ignores SIGTERM",
		"I1204 14:07:57.000000   12345 leaderelection.go:257] attempting to acquire leader lease default/x...",
		`"level"=0 "logger"="quiesce" "msg"="Stop began" "sinceStop"="0s"`, // go-logr/funcr
		"main.main\n\t/src/main.go:22", // a stack trace under a zap console line
		"\t/src/main.go:22",
		`{"message":"Stop began","severity":"INFO"}`, // other JSON keys
		`{"msg":"Stop began"}`,                       // no level
		`level=INFO sinceStop=0s`,                    // no msg
		`time=x level=INFO msg="unterminated`,
		`level=INFO msg=a"b`,
		"2026-12-04T14:12:39Z\tINFO",
		"[]",
	} {
		_, ok := Parse(line)
		if ok {
			t.Errorf("Parse(%q) read it; want not a line", line)
		}
	}
}

func TestConsoleVariants(t *testing.T) {
	g := NewWithT(t)
	// No time key, no logger name, no key/values.
	e, ok := Parse("INFO\tAll calls returned")
	g.Expect(ok).To(BeTrue())
	g.Expect(e.Msg).To(Equal("All calls returned"))
	// A caller, and colors (zap's CapitalColorLevelEncoder).
	e, ok = Parse("2026-12-04T14:12:39Z\t\x1b[34mINFO\x1b[0m\tsetup\tmain.go:71\tStarting manager")
	g.Expect(ok).To(BeTrue())
	g.Expect(e).To(And(HaveField("Msg", "Starting manager"), HaveField("Logger", "setup"), HaveField("Level", "INFO")))
	// Quoted keys and escapes in slog's text.
	e, ok = Parse(`level=WARN msg="a \"quoted\"\nline" "odd key"="x y" n=3`)
	g.Expect(ok).To(BeTrue())
	g.Expect(e.Msg).To(Equal("a \"quoted\"\nline"))
	g.Expect(e.String("odd key")).To(Equal("x y"))
	g.Expect(e.String("n")).To(Equal("3"))
	// Both error keys: zapr's "error" wins.
	e, ok = Parse(`{"level":"error","ts":1,"msg":"m","err":"b","error":"a"}`)
	g.Expect(ok).To(BeTrue())
	g.Expect(e.Error()).To(Equal("a"))
	g.Expect(e.Decode("missing", new(int))).To(BeFalse())
	// A quoted UID: logrusr's JSON of a named string type, read back in logrus' formats only.
	for line, want := range map[string]string{
		`level=info msg=m id="\"a\""`: "a", `{"level":"info","msg":"m","id":"\"a\"","time":"t"}`: "a",
		`level=INFO msg=m id="\"a\""`: `"a"`, `level=info msg=m id=a`: "a", `level=info msg=m id="\"a"`: `"a`,
	} {
		e, ok = Parse(line)
		g.Expect(ok).To(BeTrue(), line)
		g.Expect(e.UID("id")).To(Equal(want), line)
	}
}
