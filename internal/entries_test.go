package internal_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/quiesce-dev/quiesce/internal"
)

var loggedEntries = internal.Entries{
	{Name: "cm/ns/a", Age: "3s", Detached: true, ReconcileID: "r-1", Where: "pkg.F (f.go:1)", Handler: "pkg.G (g.go:2)"},
	{Name: "cm/ns/b", Age: "1s"},
}

// wantCalls is the JSON shape of loggedEntries: an array of objects with the Entry's keys.
const wantCalls = `[{"name":"cm/ns/a","age":"3s","detached":true,"reconcileID":"r-1","where":"pkg.F (f.go:1)","handler":"pkg.G (g.go:2)"},` +
	`{"name":"cm/ns/b","age":"1s","detached":false}]`

// callsOf logs loggedEntries under "calls" through l and returns the "calls" value of the
// JSON line written to buf.
func callsOf(t *testing.T, l logr.Logger, buf *bytes.Buffer) json.RawMessage {
	t.Helper()
	l.Info("Waiting for pending calls", "pending", 2, "calls", loggedEntries)
	var line struct {
		Calls json.RawMessage `json:"calls"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("line %q: %v", buf, err)
	}
	return line.Calls
}

func sameJSON(t *testing.T, got, want string) {
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

func TestEntriesAsJSONUnderSlog(t *testing.T) {
	var buf bytes.Buffer
	sameJSON(t, string(callsOf(t, logr.FromSlogHandler(slog.NewJSONHandler(&buf, nil)), &buf)), wantCalls)

	// slog's text handler: the value is the same JSON, quoted, not Go structs.
	buf.Reset()
	logr.FromSlogHandler(slog.NewTextHandler(&buf, nil)).Info("Waiting for pending calls", "calls", loggedEntries)
	_, after, ok := strings.Cut(buf.String(), " calls=")
	if !ok {
		t.Fatalf("no calls in %q", buf.String())
	}
	var text string
	if err := json.Unmarshal([]byte(strings.TrimSpace(after)), &text); err != nil {
		t.Fatalf("calls in the text line %q is no quoted string: %v", after, err)
	}
	sameJSON(t, text, wantCalls)
}

func TestEntriesAsJSONUnderZap(t *testing.T) {
	var buf bytes.Buffer
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&buf), zapcore.DebugLevel)
	sameJSON(t, string(callsOf(t, zapr.NewLogger(zap.New(core)), &buf)), wantCalls)
}
