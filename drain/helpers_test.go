package drain_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"

	"github.com/quiesce-dev/quiesce/drain"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// logLine is one captured log line (funcr's JSON form).
type logLine struct {
	Msg       string      `json:"msg"`
	Error     string      `json:"error"`
	Pending   int         `json:"pending"`
	Slow      int         `json:"slow"`
	More      int         `json:"more"`
	Cancelled int         `json:"cancelled"`
	Cause     string      `json:"cause"`
	Calls     []reportRow `json:"calls"`
	Call      string      `json:"call"`
	Panic     any         `json:"panic"`
	Stack     string      `json:"stack"`
	raw       string
}

type reportRow struct {
	Name     string `json:"name"`
	Age      string `json:"age"`
	Detached bool   `json:"detached"`
	Where    string `json:"where"`
	Handler  string `json:"handler"`
}

// logs captures log lines; lines, if set, also receives each one.
type logs struct {
	mu    sync.Mutex
	all   []logLine
	lines chan logLine
}

func (l *logs) logger(t testing.TB) logr.Logger {
	return funcr.NewJSON(func(obj string) {
		var line logLine
		if err := json.Unmarshal([]byte(obj), &line); err != nil {
			t.Errorf("log line %s: %v", obj, err)
		}
		line.raw = obj
		l.add(line)
	}, funcr.Options{})
}

// loggerFunc returns a logger that hands each line to f.
func (l *logs) loggerFunc(t testing.TB, f func(logLine)) logr.Logger {
	return funcr.NewJSON(func(obj string) {
		var line logLine
		if err := json.Unmarshal([]byte(obj), &line); err != nil {
			t.Errorf("log line %s: %v", obj, err)
		}
		line.raw = obj
		f(line)
	}, funcr.Options{})
}

func (l *logs) add(line logLine) {
	l.mu.Lock()
	l.all = append(l.all, line)
	l.mu.Unlock()
	if l.lines != nil {
		l.lines <- line
	}
}

func (l *logs) get() []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logLine(nil), l.all...)
}

// newExecutor returns an executor that is drained when the test ends, so that its
// workers exit before goleak looks.
func newExecutor(t testing.TB, opts drain.Options) *drain.Executor {
	ex := drain.New(opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ex
}

// mustGo starts fn with ex.Go and fails the test at once if ex does not admit it.
func mustGo(t testing.TB, ex *drain.Executor, name string, fn func(context.Context) error) {
	t.Helper()
	if err := ex.Go(context.Background(), name, fn); err != nil {
		t.Fatal(err)
	}
}

// drainInBackground starts a Drain with no deadline on a goroutine of its own, for tests
// that watch the drain (its reports, its effect on calls) rather than wait for it. Such a
// Drain can only return nil, once every call returned; an error fails the test.
func drainInBackground(t testing.TB, ex *drain.Executor) {
	go func() {
		if err := ex.Drain(context.Background()); err != nil {
			t.Error(err)
		}
	}()
}

// goRun calls ex.Run on a goroutine of its own, as a controller's worker would, for tests
// that do not wait for its result; an error from it fails the test.
func goRun(t testing.TB, ex *drain.Executor, name string, fn func(context.Context) error) {
	go func() {
		if err := ex.Run(context.Background(), name, fn); err != nil {
			t.Error(err)
		}
	}()
}

// lineBelow returns how a report shows the line below its caller.
func lineBelow() string {
	pc, file, line, _ := runtime.Caller(1)
	name := runtime.FuncForPC(pc).Name()
	name = name[strings.LastIndexByte(name, '/')+1:]
	return fmt.Sprintf("%s (%s:%d)", name, filepath.Base(file), line+1)
}

// blocking returns an fn that sends where it blocks on started, then blocks until release
// is closed.
func blocking(started chan<- string, release <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		started <- lineBelow()
		<-release
		return nil
	}
}

// funcName returns the full name of the function f.
func funcName(f any) string {
	return runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
}

// oneMinute is how a report shows an age of one minute.
const oneMinute = "1m0s"
