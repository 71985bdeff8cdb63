package internal_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/bombsimon/logrusr/v4"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/zapr"
	"github.com/sirupsen/logrus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/quiesce-dev/quiesce/internal"
)

var loggedEntries = internal.Entries{
	{Name: "cm/ns/a", Age: "3s", Detached: true, ReconcileID: "r-1", Where: "pkg.F (f.go:1)", Handler: "pkg.G (g.go:2)"},
	{Name: "cm/ns/b", Age: "1s"},
}

// wantCalls is the JSON shape of loggedEntries: an array of objects with the Entry's keys.
const wantCalls = `[{"name":"cm/ns/a","age":"3s","detached":true,"reconcileID":"r-1","where":"pkg.F (f.go:1)","handler":"pkg.G (g.go:2)"},` +
	`{"name":"cm/ns/b","age":"1s","detached":false}]`

// logCalls logs loggedEntries under "calls", the line's last key, through l.
func logCalls(l logr.Logger) {
	l.Info("Waiting for pending calls", "pending", 2, "calls", loggedEntries)
}

// callsOf returns the "calls" value of the JSON line in out.
func callsOf(t *testing.T, out string) string {
	t.Helper()
	var line struct {
		Calls json.RawMessage `json:"calls"`
	}
	if err := json.Unmarshal([]byte(out), &line); err != nil {
		t.Fatalf("line %q: %v", out, err)
	}
	return string(line.Calls)
}

// jsonAfter returns the JSON value that follows marker in the text line out (any text may
// follow it).
func jsonAfter(t *testing.T, out, marker string) string {
	t.Helper()
	_, after, ok := strings.Cut(out, marker)
	if !ok {
		t.Fatalf("no %s in %q", marker, out)
	}
	var v json.RawMessage
	if err := json.NewDecoder(strings.NewReader(after)).Decode(&v); err != nil {
		t.Fatalf("%s in %q is no JSON: %v", marker, out, err)
	}
	return string(v)
}

// quotedAfter returns the Go-quoted string that follows marker in the text line out, unquoted.
func quotedAfter(t *testing.T, out, marker string) string {
	t.Helper()
	_, after, ok := strings.Cut(out, marker)
	if !ok {
		t.Fatalf("no %s in %q", marker, out)
	}
	q, err := strconv.QuotedPrefix(after)
	if err != nil {
		t.Fatalf("%s in %q is no quoted string: %v", marker, out, err)
	}
	s, _ := strconv.Unquote(q)
	return s
}

// sameJSON checks that got is the JSON of wantCalls.
func sameJSON(t *testing.T, got string) {
	want := wantCalls
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("calls %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("calls = %s, want %s", got, want)
	}
}

func TestEntriesUnderSlog(t *testing.T) {
	var buf bytes.Buffer
	logCalls(logr.FromSlogHandler(slog.NewJSONHandler(&buf, nil)))
	sameJSON(t, callsOf(t, buf.String()))

	// slog's text handler: the value is the same JSON, quoted, not Go structs.
	buf.Reset()
	logCalls(logr.FromSlogHandler(slog.NewTextHandler(&buf, nil)))
	sameJSON(t, quotedAfter(t, buf.String(), " calls="))
}

func TestEntriesUnderZap(t *testing.T) {
	for name, enc := range map[string]zapcore.Encoder{
		"production":  zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		"development": zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			logCalls(zapr.NewLogger(zap.New(zapcore.NewCore(enc, zapcore.AddSync(&buf), zapcore.DebugLevel))))
			sameJSON(t, jsonAfter(t, buf.String(), `"calls":`))
		})
	}
}

// logrusr logs a logr.Marshaler's value as is: logrus' JSON formatter marshals it, its text
// formatter prints it with fmt.Sprint (quoted when it needs quotes).
func TestEntriesUnderLogrus(t *testing.T) {
	for name, f := range map[string]logrus.Formatter{"json": &logrus.JSONFormatter{}, "text": &logrus.TextFormatter{}} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			l := logrus.New()
			l.SetOutput(&buf)
			l.SetFormatter(f)
			logCalls(logrusr.New(l))
			if name == "json" {
				sameJSON(t, callsOf(t, buf.String()))
				return
			}
			sameJSON(t, quotedAfter(t, buf.String(), " calls="))
		})
	}
}

// klog writes a logr.Marshaler's value as JSON (its own logr, klog.NewKlogr, and textlogger).
func TestEntriesUnderKlog(t *testing.T) {
	t.Run("textlogger", func(t *testing.T) {
		var buf bytes.Buffer
		logCalls(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf))))
		sameJSON(t, jsonAfter(t, buf.String(), " calls="))
	})
	t.Run("klogr", func(t *testing.T) {
		var buf bytes.Buffer
		klog.LogToStderr(false)
		klog.SetOutput(&buf)
		t.Cleanup(func() { klog.SetOutput(os.Stderr); klog.LogToStderr(true) })
		logCalls(klog.NewKlogr())
		klog.Flush()
		sameJSON(t, jsonAfter(t, buf.String(), " calls="))
	})
}

// funcr renders MarshalLog's value by reflection, keys from the json tags: JSON under
// NewJSON, its own key=value form under New.
func TestEntriesUnderFuncr(t *testing.T) {
	var out string
	logCalls(funcr.NewJSON(func(obj string) { out = obj }, funcr.Options{}))
	sameJSON(t, callsOf(t, out))

	logCalls(funcr.New(func(_, args string) { out = args }, funcr.Options{}))
	const want = `"calls"=[{"name"="cm/ns/a" "age"="3s" "detached"=true "reconcileID"="r-1" "where"="pkg.F (f.go:1)" ` +
		`"handler"="pkg.G (g.go:2)"} {"name"="cm/ns/b" "age"="1s" "detached"=false}]`
	if !strings.HasSuffix(out, want) {
		t.Errorf("funcr's line = %s, want it to end with %s", out, want)
	}
}
