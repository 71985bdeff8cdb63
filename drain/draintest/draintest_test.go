package draintest_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/drain/draintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeT records what VerifyNone reports.
type fakeT struct {
	helper   bool
	failures []string
}

func (f *fakeT) Helper() { f.helper = true }
func (f *fakeT) Errorf(format string, args ...any) {
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}

var start = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newExecutor returns an executor on a fake clock, drained at the end of the test so that
// its workers exit before goleak looks; release, closed before that drain, ends the calls
// started with hang.
func newExecutor(t *testing.T) (ex *drain.Executor, clk *clocktesting.FakeClock, release chan struct{}) {
	clk = clocktesting.NewFakeClock(start)
	ex = drain.New(drain.Options{Clock: clk, CancelAfter: -1})
	release = make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ex, clk, release
}

// hang starts a call named name that ignores its context and returns once release is
// closed, and waits until it runs. It returns how a report shows where the call blocks.
func hang(t *testing.T, ex *drain.Executor, name string, release <-chan struct{}) string {
	t.Helper()
	parked := parkedHangs()
	started := make(chan string)
	err := ex.Go(context.Background(), name, func(context.Context) error {
		started <- lineBelow()
		<-release
		return nil
	})
	if err != nil {
		t.Fatalf("Go(%q) = %v", name, err)
	}
	where := <-started
	// The call is located where its goroutine is parked: wait until it left the send above
	// and blocks on release, so that a report cannot catch it a line early.
	for deadline := time.Now().Add(10 * time.Second); parkedHangs() == parked; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("the call %q never blocked on release", name)
		}
	}
	return where
}

// parkedHangs counts the goroutines of hang's calls blocked on a channel receive: on release.
func parkedHangs() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[chan receive") && strings.Contains(g, "draintest_test.hang.func1(") {
			n++
		}
	}
	return n
}

// lineBelow returns how a report shows the line below its caller.
func lineBelow() string {
	pc, file, line, _ := runtime.Caller(1)
	name := runtime.FuncForPC(pc).Name()
	name = name[strings.LastIndexByte(name, '/')+1:]
	return fmt.Sprintf("%s (%s:%d)", name, filepath.Base(file), line+1)
}

// stop drains ex as a stopped manager would have: its runnable gave up on what still runs.
func stop(t *testing.T, ex *drain.Executor) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var pe *drain.PendingError
	if err := ex.Drain(ctx); err != nil && !errors.As(err, &pe) {
		t.Fatalf("Drain(cancelled) = %v, want nil or a PendingError", err)
	}
}

func TestVerifyNonePassesWhenNothingPending(t *testing.T) {
	ex, _, _ := newExecutor(t)
	if err := ex.Call(context.Background(), "quick", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}

	var ft fakeT
	draintest.VerifyNone(&ft, ex)
	if len(ft.failures) != 0 {
		t.Errorf("VerifyNone failed with %q, want no failure", ft.failures)
	}
	if !ft.helper {
		t.Errorf("VerifyNone did not call Helper")
	}

	stop(t, ex) // drained, nothing pending: still passes
	draintest.VerifyNone(&ft, ex)
	if len(ft.failures) != 0 {
		t.Errorf("VerifyNone after Drain failed with %q, want no failure", ft.failures)
	}
}

func TestVerifyNoneListsPendingCallsOfDrainedExecutor(t *testing.T) {
	ex, clk, release := newExecutor(t)
	whereA := hang(t, ex, "demo/default/a/export", release)
	clk.Step(2 * time.Second)
	whereB := hang(t, ex, "demo/default/b/export", release)
	clk.Step(1200 * time.Millisecond)
	stop(t, ex)

	var ft fakeT
	draintest.VerifyNone(&ft, ex)
	want := "2 tracked calls still pending:\n" +
		"\t\"demo/default/a/export\": age 3s, detached, at " + whereA + "\n" +
		"\t\"demo/default/b/export\": age 1s, detached, at " + whereB
	if len(ft.failures) != 1 || ft.failures[0] != want {
		t.Errorf("VerifyNone failures:\n%q\nwant one:\n%q", ft.failures, want)
	}

	// Once the calls returned, it passes.
	close(release)
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	ft = fakeT{}
	draintest.VerifyNone(&ft, ex)
	if len(ft.failures) != 0 {
		t.Errorf("VerifyNone after the calls returned failed with %q", ft.failures)
	}
}

func TestVerifyNoneNeverStartsADrain(t *testing.T) {
	ex, clk, release := newExecutor(t)
	where := hang(t, ex, "worker", release)
	clk.Step(250 * time.Millisecond)

	var ft fakeT
	draintest.VerifyNone(&ft, ex)
	want := "1 tracked call still pending:\n" +
		"\t\"worker\": age 250ms, detached, at " + where
	if len(ft.failures) != 1 || ft.failures[0] != want {
		t.Errorf("VerifyNone failures:\n%q\nwant one:\n%q", ft.failures, want)
	}
	select {
	case <-ex.Draining():
		t.Errorf("VerifyNone started a drain")
	default:
	}
	if err := ex.Call(context.Background(), "later", func(context.Context) error { return nil }); err != nil {
		t.Errorf("Call after VerifyNone = %v, want nil", err)
	}
}

func TestVerifyNoneNilExecutor(t *testing.T) {
	var ft fakeT
	draintest.VerifyNone(&ft, nil)
	if len(ft.failures) != 1 || !strings.Contains(ft.failures[0], "nil executor") {
		t.Errorf("VerifyNone(nil) failures = %q, want one about a nil executor", ft.failures)
	}
}

// owner stands for a *runnable.Runnable.
type owner struct{ ex *drain.Executor }

func (o *owner) Executor() *drain.Executor { return o.ex }

func TestHaveNoPendingCalls(t *testing.T) {
	g := NewWithT(t)
	ex, clk, release := newExecutor(t)

	g.Expect(ex).To(draintest.HaveNoPendingCalls())
	g.Expect(&owner{ex}).To(draintest.HaveNoPendingCalls())

	where := hang(t, ex, "demo/default/a/export", release)
	clk.Step(3 * time.Second)

	m := draintest.HaveNoPendingCalls()
	ok, err := m.Match(&owner{ex})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	g.Expect(m.FailureMessage(ex)).To(Equal("Expected no tracked call pending, found 1 tracked call still pending:\n" +
		"\t\"demo/default/a/export\": age 3s, detached, at " + where))
	g.Expect(ex.Draining()).NotTo(BeClosed(), "the matcher started a drain")

	stop(t, ex)
	ok, err = m.Match(ex)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ok).To(BeFalse())
	g.Expect(m.FailureMessage(ex)).To(Equal("Expected no tracked call pending, found 1 tracked call still pending:\n" +
		"\t\"demo/default/a/export\": age 3s, detached, at " + where))

	// Eventually polls until the call returned.
	close(release)
	g.Eventually(ex).Should(draintest.HaveNoPendingCalls())
	g.Expect(m.NegatedFailureMessage(ex)).To(Equal("Expected tracked calls pending, found none"))
}

func TestHaveNoPendingCallsBadActual(t *testing.T) {
	for _, actual := range []any{nil, "executor", (*drain.Executor)(nil), &owner{}} {
		ok, err := draintest.HaveNoPendingCalls().Match(actual)
		if ok || err == nil {
			t.Errorf("Match(%#v) = %v, %v; want false and an error", actual, ok, err)
		}
	}
}

func TestVerifyNoneUnknownLocation(t *testing.T) {
	ex, _, release := newExecutor(t)
	started := make(chan struct{})
	err := ex.Go(context.Background(), "relabelled", func(context.Context) error {
		// Labels set from a context not derived from fn's hide the call's goroutine.
		pprof.SetGoroutineLabels(context.Background())
		close(started)
		<-release
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-started

	var ft fakeT
	draintest.VerifyNone(&ft, ex)
	want := "1 tracked call still pending:\n\t\"relabelled\": age 0s, detached, at an unknown location\n" +
		"(the executor logs once why a location is unknown)"
	if len(ft.failures) != 1 || ft.failures[0] != want {
		t.Errorf("VerifyNone failures:\n%q\nwant one:\n%q", ft.failures, want)
	}
}

func TestVerifyNoneSeesACallFromAdmission(t *testing.T) {
	ex, _, release := newExecutor(t)
	if err := ex.Go(context.Background(), "admitted", func(context.Context) error { <-release; return nil }); err != nil {
		t.Fatal(err)
	}
	// Whether fn's goroutine began or not, the call is pending from the moment Go returned.
	var ft fakeT
	draintest.VerifyNone(&ft, ex)
	want := "1 tracked call still pending:\n\t\"admitted\": age 0s, detached, "
	if len(ft.failures) != 1 || !strings.HasPrefix(ft.failures[0], want) {
		t.Errorf("VerifyNone failures:\n%q\nwant one starting with:\n%q", ft.failures, want)
	}
}
