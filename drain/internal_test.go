package drain

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
)

// TestIDsDecodeFromGoroutineProfile checks the trick reports rely on: each worker's id
// can be read back from its stack as runtime.GoroutineProfile records it.
func TestIDsDecodeFromGoroutineProfile(t *testing.T) {
	m := calibrate()
	if !m.ok {
		t.Fatal("calibration failed: spell's return addresses are not distinct")
	}
	e := New(Options{CancelAfter: -1})
	const n = 300 // ids of one and two digits (base 256)
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for range n {
		e.Go(context.Background(), "x", func(context.Context) error {
			started.Done()
			<-release
			return nil
		})
	}
	started.Wait()
	want := map[uint32]bool{}
	e.wmu.Lock()
	for _, w := range e.workers {
		want[w.id] = true
	}
	e.wmu.Unlock()
	if len(want) != n {
		t.Fatalf("%d distinct ids for %d workers", len(want), n)
	}
	seen := map[uint32]bool{}
	e.stackMu.Lock()
	for _, r := range e.captureStacks() {
		if id, ok := m.decodeID(r.Stack()); ok {
			if seen[id] {
				t.Errorf("id %d decoded twice", id)
			}
			seen[id] = true
		}
	}
	e.stackMu.Unlock()
	for id := range want {
		if !seen[id] {
			t.Errorf("id %d not found", id)
		}
	}
	close(release)
	e.Drain(context.Background())
}

// TestIDsDecodeFromSpell checks ids of every number of digits, by a probe in fn.
func TestIDsDecodeFromSpell(t *testing.T) {
	m := calibrate()
	if !m.ok {
		t.Fatal("calibration failed: spell's return addresses are not distinct")
	}
	e := New(Options{})
	for _, id := range []uint32{0, 1, 17, 255, 256, 257, 4095, 0xffff, 0x10000, 0x123456, 0xff00ff, 1 << 24, 0x89abcdef, 0xffffffff} {
		probe := make([]uintptr, 8)
		c, err := e.admit(context.Background(), "probe", func(context.Context) error {
			runtime.Callers(2, probe) // from spell's innermost frame on
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		w := &worker{e: e, id: id, digits: spellDigits(id)}
		w.spell(w.digits, c)
		if got, ok := m.decodeID(probe); !ok || got != id {
			t.Errorf("id %#x (%d frames): decoded %#x, %v", id, w.digits, got, ok)
		}
		// Cut off within the digits: no id, rather than a wrong one.
		if w.digits > 1 {
			if got, ok := m.decodeID(probe[:w.digits-1]); ok {
				t.Errorf("id %#x cut off: decoded %#x", id, got)
			}
		}
	}
	if err := e.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("marks table: %d entries", len(m.table))
}

func TestWhereSkipsOwnCode(t *testing.T) {
	for _, tc := range []struct {
		pkg, file string
		own, std  bool
	}{
		{"github.com/quiesce-dev/quiesce/drain", "/x/drain/worker.go", true, false},
		{"github.com/quiesce-dev/quiesce/drain", "/x/drain/drain_test.go", false, false},
		{"github.com/quiesce-dev/quiesce/drain_test", "/x/drain/drain_test.go", false, false},
		{"github.com/quiesce-dev/quiesce/reconcilers", "/x/reconcilers/wrap.go", true, false},
		{"github.com/quiesce-dev/quiesce/runnable", "/x/runnable/runnable.go", true, false},
		{"github.com/quiesce-dev/quiesce/examples/demo", "/x/examples/demo/main.go", false, false},
		{"net/http", "/go/src/net/http/client.go", false, true},
		{"runtime", "/go/src/runtime/proc.go", false, true},
		{"main", "/x/main.go", false, false},
	} {
		if got := isOwn(tc.pkg, tc.file); got != tc.own {
			t.Errorf("isOwn(%s, %s) = %v", tc.pkg, tc.file, got)
		}
		if got := isStd(tc.pkg); got != tc.std {
			t.Errorf("isStd(%s) = %v", tc.pkg, got)
		}
	}
	if got := packagePath("github.com/quiesce-dev/quiesce/drain.(*worker).exec"); got != "github.com/quiesce-dev/quiesce/drain" {
		t.Errorf("packagePath = %s", got)
	}
}

// handler stands for a handler in a _test.go file of package drain: it must be shown.
func handler(started chan<- int, release <-chan struct{}) {
	_, _, line, _ := runtime.Caller(0)
	started <- line + 2 // the line that blocks
	<-release
}

func TestWhereShowsHandlerInOwnTestFile(t *testing.T) {
	e := New(Options{CancelAfter: -1})
	started := make(chan int, 1)
	release := make(chan struct{})
	e.Go(context.Background(), "x", func(context.Context) error {
		handler(started, release)
		return nil
	})
	line := <-started
	p := e.snapshot()
	e.fillWhere(p)
	want := "drain.handler (internal_test.go:"
	if len(p) != 1 || !strings.HasPrefix(p[0].Where, want) || !strings.HasSuffix(p[0].Where, ":"+itoa(line)+")") {
		t.Errorf("Where = %+v, want %s%d)", p, want, line)
	}
	close(release)
	e.Drain(context.Background())
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestFnEndingItsGoroutineRetiresWorker: after a panic or runtime.Goexit in fn, the
// worker's goroutine exits and gives its slot back.
func TestFnEndingItsGoroutineRetiresWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := New(Options{})
		for _, fn := range []func(context.Context) error{
			func(context.Context) error { panic("x") },
			func(context.Context) error { runtime.Goexit(); return nil },
		} {
			if err := e.Call(context.Background(), "ends", fn); err == nil {
				t.Error("Call = nil")
			}
			synctest.Wait()
			e.wmu.Lock()
			if len(e.workers) != 1 || e.workers[0] != nil || len(e.free) != 1 || len(e.idle) != 0 {
				t.Errorf("workers %v, free %v, idle %v; want slot 0 free", e.workers, e.free, e.idle)
			}
			e.wmu.Unlock()
		}
		if err := e.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
