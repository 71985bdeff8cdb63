package drain_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"

	"github.com/quiesce-dev/quiesce/drain"
)

// blockAt blocks until release is closed, depth frames below its first call, and sends
// how a location shows its blocking line on at, just before it blocks.
func blockAt(depth int, at chan<- string, release <-chan struct{}) {
	if depth > 0 {
		blockAt(depth-1, at, release)
		return
	}
	at <- lineBelow()
	<-release
}

// locateAt polls Locate until the oldest call's goroutine is blocked at where (it may still
// be on its way there), and returns what Locate gave last.
func locateAt(ex *drain.Executor, where string) []drain.Pending {
	var calls []drain.Pending
	for range 1000 {
		drain.ForgetCapture() // a capture of a moment ago may show the goroutine on its way
		if calls, _ = ex.Locate(-1); len(calls) > 0 && calls[0].Where == where {
			break
		}
		runtime.Gosched()
	}
	return calls
}

// The ways to start a tracked call, named after the Executor's methods.
const (
	modeCall = "Call"
	modeGo   = "Go"
	modeRun  = "Run"
)

// startCall starts fn as a tracked call with mode; Call and Run run on a goroutine of their
// own, which wg waits for.
func startCall(t *testing.T, ex *drain.Executor, mode, name string, fn func(context.Context) error, wg *sync.WaitGroup) {
	t.Helper()
	switch mode {
	case modeGo:
		if err := ex.Go(context.Background(), name, fn); err != nil {
			t.Fatal(err)
		}
	case modeCall:
		wg.Go(func() { _ = ex.Call(context.Background(), name, fn) })
	case modeRun:
		wg.Go(func() { _ = ex.Run(context.Background(), name, fn) })
	}
}

func TestLocateAtAnyDepth(t *testing.T) {
	for _, mode := range []string{modeCall, modeGo, modeRun} {
		for _, depth := range []int{0, 30, 100} {
			t.Run(fmt.Sprint(mode, depth), func(t *testing.T) {
				ex := newExecutor(t, drain.Options{})
				release := make(chan struct{})
				at := make(chan string, 1)
				var handler string
				var wg sync.WaitGroup
				startCall(t, ex, mode, "deep", func(context.Context) error {
					handler = lineBelow()
					blockAt(depth, at, release)
					return nil
				}, &wg)
				where := <-at
				calls := locateAt(ex, where)
				close(release)
				wg.Wait()
				if len(calls) != 1 {
					t.Fatalf("Locate = %+v; want one call", calls)
				}
				if calls[0].Where != where || calls[0].Handler != handler {
					t.Errorf("Locate: where %q, handler %q; want %q, %q", calls[0].Where, calls[0].Handler, where, handler)
				}
			})
		}
	}
}

func TestLocateDoesNotDegradeWithAge(t *testing.T) {
	// Many executors and runners later, a call is still located: runner ids are never
	// reused, and nothing about them grows on the stack.
	for range 20000 {
		ex := drain.New(drain.Options{})
		if err := ex.Run(context.Background(), "short", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ex := newExecutor(t, drain.Options{})
	release := make(chan struct{})
	at := make(chan string, 1)
	if err := ex.Go(context.Background(), "late", func(context.Context) error { blockAt(100, at, release); return nil }); err != nil {
		t.Fatal(err)
	}
	where := <-at
	calls := locateAt(ex, where)
	close(release)
	if len(calls) != 1 || calls[0].Where != where {
		t.Errorf("Locate = %+v, want where %q", calls, where)
	}
}

func TestLocateTellsTheCallFromGoroutinesItStarted(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	release := make(chan struct{})
	childAt, at := make(chan string, 1), make(chan string, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	err := ex.Go(context.Background(), "parent", func(context.Context) error {
		wg.Go(func() { blockAt(3, childAt, release) }) // inherits fn's labels
		<-childAt
		blockAt(1, at, release)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	where := <-at
	calls := locateAt(ex, where)
	close(release)
	if len(calls) != 1 || calls[0].Where != where {
		t.Errorf("Locate = %+v, want where %q (the call's own goroutine)", calls, where)
	}
}

func TestLocateNestedRun(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	release := make(chan struct{})
	at := make(chan string, 1)
	var outerHandler, innerHandler string
	err := ex.Go(context.Background(), "outer", func(ctx context.Context) error {
		outerHandler = lineBelow()
		return ex.Run(ctx, "inner", func(context.Context) error {
			innerHandler = lineBelow()
			blockAt(2, at, release)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	where := <-at
	calls := locateAt(ex, where)
	close(release)
	want := []drain.Pending{
		{Name: "outer", Detached: true, Where: where, Handler: outerHandler},
		{Name: "inner", Where: where, Handler: innerHandler},
	}
	for i := range calls {
		calls[i].Started = want[i].Started
	}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("Locate =\n%+v\nwant\n%+v", calls, want)
	}
	// After the inner Run, the outer call's goroutine carries its own label again.
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestLocateUnknown(t *testing.T) {
	lines := &logs{lines: make(chan logLine, 10)}
	ex := newExecutor(t, drain.Options{Logger: lines.logger(t), CancelAfter: -1})
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	relabelled := func(context.Context) error {
		pprof.SetGoroutineLabels(context.Background()) // not derived from fn's context
		started <- struct{}{}
		<-release
		return nil
	}
	for _, name := range []string{"a", "b"} {
		if err := ex.Go(context.Background(), name, relabelled); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	<-started
	for range 2 {
		calls, _ := ex.Locate(-1)
		for _, c := range calls {
			if c.Where != drain.Unknown || c.Handler != drain.Unknown {
				t.Errorf("Locate: %+v, want where and handler %q", c, drain.Unknown)
			}
		}
	}
	close(release)
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The reason is logged once, on a goroutine of its own.
	<-lines.lines
	if got := lines.get(); len(got) != 1 || got[0].Msg != "Cannot locate pending calls" || !strings.Contains(got[0].raw, "pprof.SetGoroutineLabels") {
		t.Errorf("log = %+v, want one line saying why", got)
	}
}

func TestLocateTooDeep(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	release := make(chan struct{})
	at := make(chan string, 1)
	if err := ex.Go(context.Background(), "very deep", func(context.Context) error { blockAt(300, at, release); return nil }); err != nil {
		t.Fatal(err)
	}
	where := <-at
	calls := locateAt(ex, where)
	close(release)
	// The profile keeps the innermost 128 frames: where is found, the handler is not.
	if len(calls) != 1 || calls[0].Where != where || calls[0].Handler != drain.Unknown {
		t.Errorf("Locate = %+v, want where %q and an unknown handler", calls, where)
	}
}

func TestLocateNotStarted(t *testing.T) {
	ex := newExecutor(t, drain.Options{MaxConcurrent: 1})
	release := make(chan struct{})
	started := make(chan string, 1)
	if err := ex.Go(context.Background(), "runs", blocking(started, release)); err != nil {
		t.Fatal(err)
	}
	<-started
	calls, _ := ex.Locate(-1)
	close(release)
	if len(calls) != 1 || calls[0].Where == drain.NotStarted {
		t.Errorf("Locate = %+v", calls)
	}
}

// TestLocateInADotlessModuleWithoutOptimizations builds a program of a module whose path has
// no dot, with optimizations and inlining off, and checks what it locates: its own frames
// are not taken for the standard library's.
func TestLocateInADotlessModuleWithoutOptimizations(t *testing.T) {
	// go test puts the bin directory of its own GOROOT first in PATH.
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module myoperator\n\ngo 1.26\n\nrequire github.com/quiesce-dev/quiesce v0.0.0\n\n" +
			"replace github.com/quiesce-dev/quiesce => " + root + "\n",
		"main.go":                    dotlessMain,
		"controllers/controllers.go": dotlessControllers,
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(gobin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	goCmd("mod", "tidy")
	out := goCmd("run", "-gcflags=all=-N -l", ".")
	want := "where=controllers.(*Reconciler).Reconcile (controllers.go:15) handler=main.main.func1.1 (main.go:21)\n"
	if string(out) != want {
		t.Errorf("the dotless module located\n%s\nwant\n%s", out, want)
	}
}

const dotlessMain = `package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/quiesce-dev/quiesce/drain"

	"myoperator/controllers"
)

func main() {
	ex := drain.New(drain.Options{})
	r := &controllers.Reconciler{Started: make(chan struct{})}
	r.Mu.Lock()
	done := make(chan struct{})
	go func() {
		_ = ex.Run(context.Background(), "reconcile", func(ctx context.Context) error {
			return r.Reconcile(ctx)
		})
		close(done)
	}()
	<-r.Started
	var calls []drain.Pending
	for range 1000 { // until the reconcile blocks in Lock; a capture is reused for 1s
		if calls, _ = ex.Locate(-1); strings.HasSuffix(calls[0].Where, ":15)") {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.Mu.Unlock()
	<-done
	fmt.Printf("where=%s handler=%s\n", calls[0].Where, calls[0].Handler)
}
`

const dotlessControllers = `package controllers

import (
	"context"
	"sync"
)

type Reconciler struct {
	Mu      sync.Mutex
	Started chan struct{}
}

func (r *Reconciler) Reconcile(context.Context) error {
	close(r.Started)
	r.Mu.Lock()
	r.Mu.Unlock()
	return nil
}
`
