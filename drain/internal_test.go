package drain

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/quiesce-dev/quiesce/internal"
)

// TestLocateCallNotStarted looks at a call between its admission and its fn's start, which
// the public API cannot hold still: Go starts fn's goroutine before it returns.
func TestLocateCallNotStarted(t *testing.T) {
	e := New(Options{})
	ran := make(chan struct{})
	fn := funcHandler(func(context.Context) error {
		close(ran)
		return nil
	})
	c, err := e.admit(context.Background(), &internal.CallOptions{Name: "admitted"}, fn)
	if err != nil {
		t.Fatal(err)
	}
	c.state.Store(callDetached)
	calls := e.locate([]*call{c}, false)
	if len(calls) != 1 || calls[0].Name != "admitted" || calls[0].Where != NotStarted || calls[0].Handler != NotStarted {
		t.Errorf("locate = %+v, want the call not started", calls)
	}
	go c.exec(fn)
	<-ran
	if err := e.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestLocateCallReturning looks at a call whose fn has returned and that is not unlisted yet,
// which the public API cannot hold still either: it is said to be returning, not unknown.
func TestLocateCallReturning(t *testing.T) {
	e := New(Options{})
	ran := make(chan struct{})
	fn := funcHandler(func(context.Context) error {
		close(ran)
		return nil
	})
	c, err := e.admit(context.Background(), &internal.CallOptions{Name: "returning"}, fn)
	if err != nil {
		t.Fatal(err)
	}
	c.state.Store(callDetached)
	c.since.Store(sinceLeft) // as leave stores it once fn returned
	calls := e.locate([]*call{c}, false)
	if len(calls) != 1 || calls[0].Where != Returning || calls[0].Handler != Returning {
		t.Errorf("locate = %+v, want the call returning", calls)
	}
	go c.exec(fn)
	<-ran
	if err := e.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestIsStdInADotlessModule(t *testing.T) {
	saved := modules
	t.Cleanup(func() { modules = saved })
	modules = func() []string { return []string{"myoperator", "github.com/go-logr/logr"} }
	for pkg, want := range map[string]bool{
		"sync":                    true,
		"internal/sync":           true,
		"vendor/golang.org/x/net": true,
		"myoperator":              false,
		"myoperator/controllers":  false,
		"myoperatorx/controllers": true, // not the module: a prefix of a path element
		"github.com/go-logr/logr": false,
		"main":                    false,
		"example.com/not/in/deps": false, // a dot: never the standard library
		"command-line-arguments":  false,
	} {
		if got := isStd(pkg); got != want {
			t.Errorf("isStd(%q) = %v, want %v", pkg, got, want)
		}
	}
}

// TestCaptureIsShared: concurrent askers share one capture, later ones reuse it for a
// second if it saw their calls' labels, and a call labelled after it gets a new one.
func TestCaptureIsShared(t *testing.T) {
	var taken atomic.Int32
	saved := captureTaken
	t.Cleanup(func() { captureTaken = saved })
	captureTaken = func() { taken.Add(1) }

	synctest.Test(t, func(t *testing.T) {
		e := New(Options{})
		release := make(chan struct{})
		started := make(chan struct{})
		if err := e.Go(context.Background(), "first", func(context.Context) error { close(started); <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		<-started
		captures.mu.Lock()
		captures.last = nil
		captures.mu.Unlock()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if calls, _ := e.Locate(-1); len(calls) != 1 || calls[0].Where == Unknown {
					t.Errorf("Locate = %+v", calls)
				}
			})
		}
		wg.Wait()
		if n := taken.Load(); n != 1 {
			t.Errorf("8 concurrent Locates took %d captures, want 1", n)
		}
		time.Sleep(captureReuse - time.Millisecond)
		e.Locate(-1)
		if n := taken.Load(); n != 1 {
			t.Errorf("a Locate within captureReuse took a capture of its own (%d)", n)
		}
		started2 := make(chan struct{})
		if err := e.Go(context.Background(), "second", func(context.Context) error { close(started2); <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		<-started2
		if calls, _ := e.Locate(-1); len(calls) != 2 || calls[1].Where == Unknown {
			t.Errorf("Locate = %+v", calls)
		}
		if n := taken.Load(); n != 2 {
			t.Errorf("a call labelled after the capture was located from it (%d captures)", n)
		}
		time.Sleep(captureReuse)
		e.Locate(-1)
		if n := taken.Load(); n != 3 {
			t.Errorf("a capture older than captureReuse was reused (%d captures)", n)
		}
		close(release)
		if err := e.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSlowCallsCaptureOnlyWhenTheyLog: while the set of slow calls is unchanged, the
// checks between two lines take no capture.
func TestSlowCallsCaptureOnlyWhenTheyLog(t *testing.T) {
	var taken atomic.Int32
	saved := captureTaken
	t.Cleanup(func() { captureTaken = saved })
	captureTaken = func() { taken.Add(1) }

	synctest.Test(t, func(t *testing.T) {
		var lines atomic.Int32
		e := New(Options{Logger: funcr.New(func(string, string) { lines.Add(1) }, funcr.Options{})})
		release := make(chan struct{})
		if err := e.Go(context.Background(), "stuck", func(context.Context) error { <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n, l := taken.Load(), lines.Load(); n != l || l != 10 {
			t.Errorf("%d captures for %d lines in an hour, want one per line, 10 lines", n, l)
		}
		close(release)
		if err := e.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestShieldedCallIsWithoutCancel: a shielded call, as a context, answers as
// context.WithoutCancel of its caller's: no deadline, Done nor Err, no cause, the values;
// unshielded, as the caller's. The key it answers for pprof's labels was learnt.
func TestShieldedCallIsWithoutCancel(t *testing.T) {
	if labelsKey == nil {
		t.Fatal("pprof's labels key not learnt")
	}
	e := New(Options{})
	e.settings.Owned = true
	parent, cancel := context.WithTimeoutCause(context.WithValue(context.Background(), internal.CallKey{}, "outer"), time.Hour, errFinished)
	cancel()
	for _, shield := range []bool{false, true} {
		c := newCall(parent, e, &internal.CallOptions{Name: "c", Shield: shield}, false)
		want := parent
		if shield {
			want = context.WithoutCancel(parent)
		}
		_, hasDeadline := c.Deadline()
		_, wantDeadline := want.Deadline()
		if hasDeadline != wantDeadline || c.Done() != want.Done() || c.Err() != want.Err() ||
			context.Cause(c) != context.Cause(want) || c.Value(internal.CallKey{}) != c || c.Context.Value(internal.CallKey{}) != "outer" {
			t.Errorf("shield=%t: the call as a context differs from %v", shield, want)
		}
		c.cancel(errFinished)
	}
}

// A call renamed from fn's goroutine is listed and returned by FromContext under its new
// name, in one part, while another goroutine lists it (-race checks the lock).
func TestRenameRunningCall(t *testing.T) {
	const newName = "webhook/p/ns/real"
	e := New(Options{})
	started, rename, renamed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	release, done := make(chan struct{}), make(chan error)
	var inside string
	var opts internal.CallOptions
	go func() {
		done <- internal.Of(e).Run(context.Background(), internal.CallOptions{Name: "webhook/p", Namespace: "ns", Object: "o"},
			func(ctx context.Context) error {
				close(started)
				<-rename // listed meanwhile under its first name
				c, _ := internal.CallOf(ctx)
				c.Rename(newName)
				_, inside, _ = FromContext(ctx)
				opts = c.Options()
				close(renamed)
				<-release
				return nil
			})
	}()
	<-started
	if p := e.Pending(); len(p) != 1 || p[0].Name != "webhook/p/ns/o" {
		t.Errorf("Pending before Rename = %+v, want webhook/p/ns/o", p)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // lists the call while it is renamed
		for !internal.Closed(stop) {
			_ = e.Pending()
		}
	})
	close(rename)
	<-renamed
	close(stop)
	wg.Wait()
	pending := e.Pending()
	ents, _ := internal.Of(e).Entries(-1)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(pending) != 1 || pending[0].Name != newName || len(ents) != 1 || ents[0].Name != newName ||
		inside != newName || opts.Name != newName || opts.Namespace != "" || opts.Object != "" {
		t.Errorf("after Rename: Pending %+v, Entries %+v, FromContext %q, Options %+v; want webhook/p/ns/real, in Name alone",
			pending, ents, inside, opts)
	}
}
