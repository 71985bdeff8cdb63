package drain_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"

	"github.com/quiesce-dev/quiesce/drain"
)

func TestPendingFromAdmission(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	release := make(chan struct{})
	ran := make(chan error, 1)
	if err := ex.Go(context.Background(), "admitted", func(ctx context.Context) error {
		<-release
		ran <- ctx.Err()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Whether or not fn's goroutine began, the call is listed the moment Go returned.
	if ps := ex.Pending(); len(ps) != 1 || ps[0].Name != "admitted" {
		t.Fatalf("Pending right after Go = %+v", ps)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := ex.Drain(ctx)
	var pe *drain.PendingError
	if !errors.As(err, &pe) || len(pe.Pending) != 1 || pe.Pending[0].Name != "admitted" {
		t.Fatalf("Drain(done ctx) = %v, want a PendingError naming the call", err)
	}
	if s := ex.Stats(); s.Abandoned != 1 || s.InFlight != 1 {
		t.Errorf("Stats = %+v, want the call in flight and abandoned", s)
	}
	close(release)
	// fn runs on, with its context cancelled by the drain (CancelAfter 0).
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("fn's ctx.Err() = %v, want Canceled", err)
	}
}

// panickingSink is a logr.LogSink that panics on every line.
type panickingSink struct{}

func (panickingSink) Init(logr.RuntimeInfo)            {}
func (panickingSink) Enabled(int) bool                 { return true }
func (panickingSink) Info(int, string, ...any)         { panic("logger broke") }
func (panickingSink) Error(error, string, ...any)      { panic("logger broke") }
func (s panickingSink) WithValues(...any) logr.LogSink { return s }
func (s panickingSink) WithName(string) logr.LogSink   { return s }

func TestPanickingLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{Logger: logr.New(panickingSink{}), SlowAfter: time.Second, CancelAfter: -1})
		// A Go call's panic is logged: the logger's panic is contained.
		if err := ex.Go(context.Background(), "panics", func(context.Context) error { panic("fn broke") }); err != nil {
			t.Fatal(err)
		}
		// A slow call and a drain report are logged too.
		release := make(chan struct{})
		if err := ex.Go(context.Background(), "slow", func(context.Context) error { <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		drained := make(chan error)
		go func() { drained <- ex.Drain(context.Background()) }()
		time.Sleep(3 * time.Second) // past ReportAfter
		synctest.Wait()
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if s := ex.Stats(); s.Panicked != 1 || s.Finished != 2 {
			t.Errorf("Stats = %+v", s)
		}
	})
}

// blockingSink is a logr.LogSink whose every line blocks until unblock is closed.
type blockingSink struct {
	unblock <-chan struct{}
	lines   *atomic.Int32
}

func (blockingSink) Init(logr.RuntimeInfo)            {}
func (blockingSink) Enabled(int) bool                 { return true }
func (s blockingSink) Info(int, string, ...any)       { s.lines.Add(1); <-s.unblock }
func (s blockingSink) Error(error, string, ...any)    { s.lines.Add(1); <-s.unblock }
func (s blockingSink) WithValues(...any) logr.LogSink { return s }
func (s blockingSink) WithName(string) logr.LogSink   { return s }

func TestBlockingLoggerDelaysNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		unblock := make(chan struct{})
		var lines atomic.Int32
		ex := drain.New(drain.Options{
			Logger:      logr.New(blockingSink{unblock, &lines}),
			ReportAfter: time.Second, ReportEvery: time.Second, CancelAfter: 3 * time.Second,
		})
		cancelled := make(chan time.Duration, 1)
		start := time.Now()
		if err := ex.Go(context.Background(), "waits", func(ctx context.Context) error {
			<-ctx.Done()
			cancelled <- time.Since(start)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := <-cancelled; d != 3*time.Second {
			t.Errorf("cancelled after %v, want CancelAfter 3s despite the blocked report", d)
		}
		// Reports at 1s and 2s: the first blocks, the second is skipped, not piled up; the
		// line naming the calls cancelled at 3s blocks on a goroutine of its own.
		if n := lines.Load(); n != 2 {
			t.Errorf("%d log lines began, want 2", n)
		}
		close(unblock)
	})
}

// TestPanicNil runs itself again with GODEBUG=panicnil=1: panic(nil) then gives recover a
// nil value, which must still be a *PanicError, not mistaken for runtime.Goexit.
func TestPanicNil(t *testing.T) {
	nilPanic := func(context.Context) error { panic(nil) }
	if os.Getenv("QUIESCE_TEST_PANICNIL") == "1" {
		ex := newExecutor(t, drain.Options{})
		for name, run := range map[string]func(context.Context, string, func(context.Context) error) error{modeCall: ex.Call, modeRun: ex.Run} {
			var pe *drain.PanicError
			if err := run(context.Background(), "nil", nilPanic); !errors.As(err, &pe) || pe.Value != nil {
				t.Errorf("%s with panic(nil) = %#v, want a *PanicError with a nil value", name, err)
			}
		}
		if s := ex.Stats(); s.Panicked != 2 || s.Finished != 2 {
			t.Errorf("Stats = %+v", s)
		}
		return
	}
	// Without panicnil, panic(nil) panics with a *runtime.PanicNilError.
	ex := newExecutor(t, drain.Options{})
	var pn *runtime.PanicNilError
	if err := ex.Call(context.Background(), "nil", nilPanic); !errors.As(err, &pn) {
		t.Errorf("Call with panic(nil) = %#v, want a *PanicError unwrapping to *runtime.PanicNilError", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestPanicNil$", "-test.v")
	cmd.Env = append(os.Environ(), "QUIESCE_TEST_PANICNIL=1", "GODEBUG=panicnil=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestPanicNil") {
		t.Errorf("with GODEBUG=panicnil=1: %v\n%s", err, out)
	}
}

func TestPanicErrorUnwraps(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	err := ex.Call(context.Background(), "eof", func(context.Context) error { panic(io.EOF) })
	var pe *drain.PanicError
	if !errors.As(err, &pe) || !errors.Is(err, io.EOF) {
		t.Errorf("Call = %v, want a *PanicError for which errors.Is(err, io.EOF)", err)
	}
	err = ex.Call(context.Background(), "str", func(context.Context) error { panic("text") })
	if !errors.As(err, &pe) || errors.Unwrap(err) != nil {
		t.Errorf("Call = %v, want a *PanicError that unwraps to nothing", err)
	}
}

func TestStatsInvariants(t *testing.T) {
	ex := drain.New(drain.Options{})
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var bad atomic.Value
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := ex.Stats()
			if s.Finished > s.Started || s.InFlight < 0 || uint64(s.InFlight) > s.Started-s.Finished+uint64(runtime.GOMAXPROCS(0))*64 {
				bad.Store(s)
			}
		}
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				_ = ex.Call(context.Background(), "c", func(context.Context) error { return nil })
				_ = ex.Run(context.Background(), "r", func(context.Context) error { return nil })
			}
		})
	}
	wg.Wait()
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Refused calls never show in flight, not even for a moment.
	refusers := sync.WaitGroup{}
	var seenInFlight atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := ex.Stats().InFlight; n != 0 {
				seenInFlight.Store(n)
			}
		}
	}()
	for range 8 {
		refusers.Go(func() {
			for range 500 {
				if err := ex.Go(context.Background(), "refused", func(context.Context) error { return nil }); !errors.Is(err, drain.ErrDraining) {
					t.Errorf("Go after the drain = %v", err)
					return
				}
			}
		})
	}
	refusers.Wait()
	close(stop)
	sampler.Wait()
	<-done
	if s, _ := bad.Load().(drain.Stats); s != (drain.Stats{}) {
		t.Errorf("inconsistent snapshot: %+v", s)
	}
	if n := seenInFlight.Load(); n != 0 {
		t.Errorf("refused calls showed as %d in flight", n)
	}
	if s := ex.Stats(); s.Started != 8000 || s.Finished != 8000 || s.Refused != 4000 {
		t.Errorf("Stats = %+v", s)
	}
}

func TestPendingErrorIsBounded(t *testing.T) {
	pe := &drain.PendingError{Err: context.DeadlineExceeded}
	for i := range 25 {
		pe.Pending = append(pe.Pending, drain.Pending{Name: fmt.Sprint("call-", i), Where: "x.f (x.go:1)"})
	}
	msg := pe.Error()
	if !strings.HasPrefix(msg, `failed to drain: context deadline exceeded: 25 call(s) still running: "call-0" at "x.f (x.go:1)", `) ||
		!strings.HasSuffix(msg, `"call-19" at "x.f (x.go:1)" and 5 more`) || strings.Contains(msg, "call-20") {
		t.Errorf("Error() = %q", msg)
	}
	if len(pe.Pending) != 25 {
		t.Errorf("Pending has %d calls, want all 25", len(pe.Pending))
	}
}

// TestHostileNames: a name cannot forge a line of an error, nor flood it.
func TestHostileNames(t *testing.T) {
	huge := strings.Repeat("x", 10<<20)
	pe := &drain.PendingError{Err: context.DeadlineExceeded, Pending: []drain.Pending{
		{Name: "a\nlevel=error msg=forged"}, {Name: huge},
	}}
	msg := pe.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("Error() has a newline: %q", msg)
	}
	if len(msg) > 1024 || !strings.Contains(msg, "...(10485760 bytes)") {
		t.Errorf("Error() is %d bytes, want the huge name cut and marked: %.400q", len(msg), msg)
	}
	if got := (&drain.PanicError{Name: huge, Value: "boom"}).Error(); len(got) > 512 {
		t.Errorf("PanicError.Error() is %d bytes", len(got))
	}
}

func TestSlowCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), SlowAfter: 10 * time.Second, ReportEvery: 5 * time.Second})
		release := make(chan struct{})
		started := make(chan string, 30)
		quick := make(chan struct{})
		// A call that returns before SlowAfter is never logged.
		if err := ex.Go(context.Background(), "quick", func(context.Context) error { <-quick; return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(9 * time.Second)
		close(quick)
		synctest.Wait()
		if err := ex.Go(context.Background(), "stuck", blocking(started, release)); err != nil {
			t.Fatal(err)
		}
		where := <-started
		check := func(at time.Duration, want int) {
			t.Helper()
			time.Sleep(at)
			synctest.Wait()
			if got := len(lines.get()); got != want {
				t.Fatalf("after %v more: %d log lines, want %d: %+v", at, got, want, lines.get())
			}
		}
		check(9*time.Second, 0) // stuck is 9s old
		check(time.Second, 1)   // 10s: slow
		got := lines.get()[0]
		if got.Msg != "Slow calls" || got.Slow != 1 || len(got.Calls) != 1 || got.Calls[0].Name != "stuck" ||
			got.Calls[0].Age != "10s" || got.Calls[0].Where != where || got.Calls[0].Handler != where || !got.Calls[0].Detached {
			t.Errorf("slow line = %s", got.raw)
		}
		check(4*time.Second, 1) // at most once per ReportEvery
		check(time.Second, 2)   // 15s: the same set, ReportEvery later

		// Bounded: 25 more stuck calls, 26 slow, 20 listed. They turn slow at 25s, when
		// the unchanged set would have waited 10s more anyway.
		for i := range 25 {
			if err := ex.Go(context.Background(), fmt.Sprint("more-", i), blocking(started, release)); err != nil {
				t.Fatal(err)
			}
			<-started
		}
		check(9*time.Second, 2)
		check(time.Second, 3)
		if last := lines.get()[2]; last.Slow != 26 || len(last.Calls) != 20 || last.More != 6 || last.Calls[0].Name != "stuck" {
			t.Errorf("slow line = %s", last.raw)
		}

		// Nothing slow, nothing logged; and no goroutine is left while the executor idles.
		close(release)
		synctest.Wait()
		check(time.Minute, 3)
		if n := ex.Stats().InFlight; n != 0 {
			t.Fatalf("%d in flight", n)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestSlowCallsOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), SlowAfter: -1, CancelAfter: -1})
		release := make(chan struct{})
		if err := ex.Go(context.Background(), "stuck", func(context.Context) error { <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := lines.get(); len(got) != 0 {
			t.Errorf("logged %+v with SlowAfter < 0", got)
		}
	})
}

func TestStatsOldestAndSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{SlowAfter: 10 * time.Second})
		if s := ex.Stats(); !s.Oldest.IsZero() || s.Slow != 0 {
			t.Fatalf("idle Stats = %+v", s)
		}
		release := make(chan struct{})
		start := time.Now()
		for _, name := range []string{"a", "b"} {
			if err := ex.Go(context.Background(), name, func(context.Context) error { <-release; return nil }); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Second)
		}
		// a is 10s old, b 5s.
		if s := ex.Stats(); !s.Oldest.Equal(start) || s.Slow != 1 {
			t.Errorf("Stats = %+v, want Oldest %v and 1 slow", s, start)
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if s := ex.Stats(); !s.Oldest.IsZero() || s.Slow != 0 {
			t.Errorf("drained Stats = %+v", s)
		}
	})
}

// TestSlowCallsBackOff: one call stuck for an hour, with the default SlowAfter and
// ReportEvery, is logged 10 times, on the schedule Options.SlowAfter documents, and each
// line but the first reuses nothing it need not: the set is unchanged.
func TestSlowCallsBackOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t)})
		release := make(chan struct{})
		started := make(chan string, 1)
		if err := ex.Go(context.Background(), "stuck", blocking(started, release)); err != nil {
			t.Fatal(err)
		}
		<-started
		time.Sleep(time.Hour)
		synctest.Wait()
		var ages []string
		for _, l := range lines.get() {
			if l.Msg == "Slow calls" && len(l.Calls) == 1 {
				ages = append(ages, l.Calls[0].Age)
			}
		}
		want := []string{oneMinute, "1m5s", "1m15s", "1m35s", "2m15s", "3m35s", "6m15s", "11m35s", "22m15s", "43m35s"}
		if fmt.Sprint(ages) != fmt.Sprint(want) || len(lines.get()) != len(want) {
			t.Errorf("slow lines at ages %v (%d lines), want %v", ages, len(lines.get()), want)
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGoPanicLoggedBeforeDrainReturns: the panic of a call nobody waits for is logged
// before the call is unlisted, so a Drain that returned has seen it logged.
func TestGoPanicLoggedBeforeDrainReturns(t *testing.T) {
	lines := &logs{}
	ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1})
	release := make(chan struct{})
	if err := ex.Go(context.Background(), "boom", func(context.Context) error { <-release; panic("kaboom") }); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- ex.Drain(context.Background()) }()
	<-ex.Draining()
	close(release)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	got := lines.get()
	if len(got) != 1 || got[0].Msg != "Call panicked" || got[0].Call != "boom" {
		t.Errorf("log when Drain returned: %+v, want the panic", got)
	}
}
