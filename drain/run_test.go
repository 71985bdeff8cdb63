package drain_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// goid returns the id of the calling goroutine, from its stack header.
func goid(t testing.TB) uint64 {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	field, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	id, err := strconv.ParseUint(string(field), 10, 64)
	if err != nil {
		t.Fatalf("goroutine id in %q: %v", buf, err)
	}
	return id
}

func TestRunReturnsResult(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	want := errors.New("boom")
	if err := ex.Run(context.Background(), "fails", func(context.Context) error { return want }); err != want {
		t.Fatalf("Run = %v, want %v", err, want)
	}
	if err := ex.Run(context.Background(), "works", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if got, want := ex.Stats(), (drain.Stats{Started: 2, Finished: 2}); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

func TestRunOnCallersGoroutine(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	caller := goid(t)
	var inRun, inCall uint64
	if err := ex.Run(context.Background(), "run", func(context.Context) error { inRun = goid(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := ex.Call(context.Background(), "call", func(context.Context) error { inCall = goid(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inRun != caller {
		t.Errorf("Run's fn ran on goroutine %d, the caller is %d", inRun, caller)
	}
	if inCall == caller { // the check above can fail: Call's fn runs elsewhere
		t.Errorf("Call's fn ran on the caller's goroutine %d", caller)
	}
}

func TestRunRefusedOnceDraining(t *testing.T) {
	ex := drain.New(drain.Options{})
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := ex.Run(context.Background(), "late", func(context.Context) error { ran = true; return nil }); !errors.Is(err, drain.ErrDraining) {
		t.Errorf("Run = %v, want ErrDraining", err)
	}
	if ran {
		t.Error("fn ran after refusal")
	}
	if s := ex.Stats(); s != (drain.Stats{Refused: 1}) {
		t.Errorf("Stats = %+v", s)
	}
}

func TestRunBadInputAndDoneCtx(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		fn   func(context.Context) error
	}{
		{"", context.Background(), fn},
		{"nil fn", context.Background(), nil},
		{"nil ctx", nil, fn},
	} {
		if err := ex.Run(tc.ctx, tc.name, tc.fn); !errors.Is(err, drain.ErrInvalidCall) {
			t.Errorf("Run(%q) = %v, want ErrInvalidCall", tc.name, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ex.Run(ctx, "late", fn); !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if ran {
		t.Error("fn ran")
	}
	if s := ex.Stats(); s != (drain.Stats{}) {
		t.Errorf("counted: %+v", s)
	}
}

func TestDrainWaitsForRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		started := make(chan string, 1)
		release := make(chan struct{})
		result := make(chan error, 1)
		go func() { result <- ex.Run(context.Background(), "run", blocking(started, release)) }()
		<-started
		if p := ex.Pending(); len(p) != 1 || p[0].Name != "run" || p[0].Detached {
			t.Errorf("Pending = %+v, want run, not detached", p)
		}
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-drained:
			t.Fatalf("Drain returned %v while Run's fn runs", err)
		default:
		}
		close(release)
		if err := <-result; err != nil {
			t.Errorf("Run = %v", err)
		}
		if err := <-drained; err != nil {
			t.Fatalf("Drain = %v", err)
		}
		if s := ex.Stats(); s != (drain.Stats{Started: 1, Finished: 1}) {
			t.Errorf("Stats = %+v", s)
		}
	})
}

func TestRunWaitsForFnWhenCtxEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		type key struct{}
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		release := make(chan struct{})
		fnErr := make(chan error, 1)
		want := errors.New("fn's own result")
		result := make(chan error, 1)
		go func() {
			result <- ex.Run(ctx, "run", func(ctx context.Context) error {
				if v := ctx.Value(key{}); v != "v" {
					t.Errorf("Value = %v", v)
				}
				<-ctx.Done()
				fnErr <- ctx.Err()
				<-release
				return want
			})
		}()
		synctest.Wait()
		cancel()
		if err := <-fnErr; !errors.Is(err, context.Canceled) {
			t.Errorf("fn's Err = %v, want Canceled", err)
		}
		synctest.Wait()
		select {
		case err := <-result:
			t.Fatalf("Run returned %v before fn", err)
		default:
		}
		if p := ex.Pending(); len(p) != 1 || p[0].Detached {
			t.Errorf("Pending = %+v, want one call, not detached", p)
		}
		close(release)
		if err := <-result; err != want {
			t.Errorf("Run = %v, want %v", err, want)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// runCancelledAt is cancelledAt with Run: how long after the drain began Run's fn saw its
// context end (or -1 if not within 1h).
func runCancelledAt(t *testing.T, cancelAfter time.Duration) time.Duration {
	var took time.Duration
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: cancelAfter})
		started := make(chan struct{})
		ended := make(chan time.Time, 1)
		goRun(t, ex, "waits", func(ctx context.Context) error {
			close(started)
			select {
			case <-ctx.Done():
				ended <- time.Now()
			case <-time.After(time.Hour):
			}
			return nil
		})
		<-started
		begin := time.Now()
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-ended:
			took = at.Sub(begin)
		default:
			took = -1
		}
	})
	return took
}

func TestRunCancelAfter(t *testing.T) {
	for _, tc := range []struct {
		cancelAfter, want time.Duration
	}{
		{0, 0},
		{5 * time.Second, 5 * time.Second},
		{-1, -1},
	} {
		if got := runCancelledAt(t, tc.cancelAfter); got != tc.want {
			t.Errorf("CancelAfter %v: Run's context ended after %v, want %v", tc.cancelAfter, got, tc.want)
		}
	}
}

func TestRunCancelAfterOnClock(t *testing.T) {
	fake := clocktesting.NewFakeClock(time.Now())
	ex := newExecutor(t, drain.Options{Clock: fake, CancelAfter: time.Minute})
	started := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- ex.Run(context.Background(), "waits", func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	<-started
	drained := make(chan error, 1)
	go func() { drained <- ex.Drain(context.Background()) }()
	<-ex.Draining()
	fake.Step(time.Minute)
	if err := <-result; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want Canceled", err)
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
}

func TestRunMaxConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{MaxConcurrent: 1, CancelAfter: -1})
		started := make(chan string, 1)
		release := make(chan struct{})
		mustGo(t, ex, "holds the slot", blocking(started, release))
		<-started
		ran := false

		// A waiting Run honours its ctx...
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := ex.Run(ctx, "times out", func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Run = %v, want DeadlineExceeded", err)
		}
		// ... and the drain.
		result := make(chan error, 1)
		go func() {
			result <- ex.Run(context.Background(), "waits", func(context.Context) error { ran = true; return nil })
		}()
		synctest.Wait()
		if s := ex.Stats(); s.InFlight != 1 || s.Started != 1 {
			t.Errorf("Stats = %+v, want 1 in flight and started (1 waiting for the slot)", s)
		}
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		if err := <-result; !errors.Is(err, drain.ErrDraining) {
			t.Errorf("waiting Run = %v, want ErrDraining", err)
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if ran {
			t.Error("a Run without a slot ran")
		}
		if s := ex.Stats(); s.Refused != 1 || s.Started != 1 || s.Finished != 1 || s.InFlight != 0 {
			t.Errorf("Stats = %+v", s)
		}
	})
}

func TestRunPanics(t *testing.T) {
	lines := &logs{}
	var afterErr error
	ex := newExecutor(t, drain.Options{Logger: lines.logger(t)})
	internal.Of(ex).Settings().AfterCall = func(_ string, _ time.Duration, err error) { afterErr = err }
	err := ex.Run(context.Background(), "panics", func(context.Context) error { panic("oops") })
	var pe *drain.PanicError
	if !errors.As(err, &pe) || pe.Name != "panics" || pe.Value != "oops" || !strings.Contains(string(pe.Stack), "drain_test.TestRunPanics") {
		t.Fatalf("Run = %#v, want a *PanicError with name, value and stack", err)
	}
	if afterErr != err {
		t.Errorf("AfterCall saw %v, want the *PanicError", afterErr)
	}
	if n := len(lines.get()); n != 0 {
		t.Errorf("a panic returned by Run was also logged (%d lines)", n)
	}
	if s := ex.Stats(); s != (drain.Stats{Started: 1, Finished: 1, Panicked: 1}) {
		t.Errorf("Stats = %+v", s)
	}
}

func TestRunAfterCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type seen struct {
			name string
			took time.Duration
			err  error
		}
		var got []seen
		ex := drain.New(drain.Options{})
		internal.Of(ex).Settings().AfterCall = func(controller string, took time.Duration, err error) {
			got = append(got, seen{controller, took, err})
		}
		boom := errors.New("boom")
		// The call's result reaches AfterCall, which is what this test checks.
		_ = internal.Of(ex).Run(context.Background(), internal.CallOptions{Name: "c/ns/obj", Controller: "c"}, func(context.Context) error { time.Sleep(3 * time.Second); return boom })
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != (seen{"c", 3 * time.Second, boom}) {
			t.Errorf("AfterCall saw %+v", got)
		}
	})
}

func TestRunGoexit(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		// Run never returns: fn's Goexit ends this goroutine, as calling fn directly would.
		_ = ex.Run(context.Background(), "exits", func(context.Context) error { runtime.Goexit(); return nil })
		t.Error("Run returned after runtime.Goexit in fn")
	}()
	<-exited
	// The call was settled, and the executor still works.
	if err := ex.Run(context.Background(), "after", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if s := ex.Stats(); s != (drain.Stats{Started: 2, Finished: 2}) {
		t.Errorf("Stats = %+v", s)
	}
}

// blockingRun is blocking for Run's calls: it blocks at a line of its own, so that reports
// tell Run's calls from Go's by their Where.
func blockingRun(started chan<- string, release <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		started <- lineBelow()
		<-release
		return nil
	}
}

// TestReportShowsRun checks that reports find Run's calls on their callers' goroutines,
// each at its own line, among workers' calls and a Run nested in a worker's call.
func TestReportShowsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1, ReportAfter: time.Minute})
		release := make(chan struct{})
		started := make(chan string, 1)
		runBlocking := blockingRun(started, release)
		var want []reportRow
		for i := range 3 {
			name := fmt.Sprint("go-", i)
			mustGo(t, ex, name, blocking(started, release))
			at := <-started
			want = append(want, reportRow{name, "", true, at, at})
			name = fmt.Sprint("run-", i)
			goRun(t, ex, name, runBlocking)
			at = <-started
			want = append(want, reportRow{name, "", false, at, at})
		}
		// A Run inside a Go call's fn: both calls are blocked at the same line, each in
		// its own handler.
		var outerHandler string
		mustGo(t, ex, "outer", func(ctx context.Context) error {
			outerHandler = lineBelow()
			return ex.Run(ctx, "inner", runBlocking)
		})
		at := <-started
		want = append(want, reportRow{"outer", "", true, at, outerHandler}, reportRow{"inner", "", false, at, at})

		drainInBackground(t, ex)
		time.Sleep(time.Minute)
		synctest.Wait()
		got := lines.get()
		if len(got) != 1 {
			t.Fatalf("%d reports, want 1", len(got))
		}
		for i := range want {
			want[i].Age = oneMinute
		}
		if fmt.Sprint(got[0].Calls) != fmt.Sprint(want) {
			t.Errorf("report calls\n %+v\nwant\n %+v", got[0].Calls, want)
		}

		// A Drain that gives up names them with the same Where.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var pe *drain.PendingError
		if err := ex.Drain(ctx); !errors.As(err, &pe) {
			t.Fatalf("Drain = %v, want *PendingError", err)
		}
		if len(pe.Pending) != len(want) {
			t.Fatalf("PendingError names %d calls, want %d", len(pe.Pending), len(want))
		}
		for i, p := range pe.Pending {
			if p.Name != want[i].Name || p.Where != want[i].Where || p.Detached != want[i].Detached {
				t.Errorf("Pending[%d] = %+v, want %+v", i, p, want[i])
			}
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestFromContext(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	check := func(what string, ctx context.Context, wantName string) {
		t.Helper()
		gotEx, gotName, ok := drain.FromContext(ctx)
		if wantName == "" {
			if ok || gotEx != nil || gotName != "" {
				t.Errorf("%s: FromContext = %p, %q, %v; want nothing", what, gotEx, gotName, ok)
			}
			return
		}
		if !ok || gotEx != ex || gotName != wantName {
			t.Errorf("%s: FromContext = %p, %q, %v; want %p, %q, true", what, gotEx, gotName, ok, ex, wantName)
		}
	}
	check("background", context.Background(), "")
	check("nil", nil, "")
	type key struct{}
	check("value", context.WithValue(context.Background(), key{}, "x"), "")

	if err := ex.Call(context.Background(), "call", func(ctx context.Context) error {
		check("in Call", ctx, "call")
		child, cancel := context.WithCancel(ctx)
		defer cancel()
		check("derived with WithCancel", child, "call")
		check("derived with WithValue", context.WithValue(child, key{}, "x"), "call")
		if err := ex.Run(child, "nested", func(ctx context.Context) error {
			check("in Run nested in Call", ctx, "nested")
			return nil
		}); err != nil {
			t.Error(err)
		}
		if n := testing.AllocsPerRun(100, func() { drain.FromContext(child) }); n != 0 {
			t.Errorf("FromContext allocates %v times", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := ex.Run(context.Background(), "run", func(ctx context.Context) error {
		check("in Run", ctx, "run")
		child, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		check("derived with WithTimeout", child, "run")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	mustGo(t, ex, "go", func(ctx context.Context) error {
		defer close(done)
		check("in Go", ctx, "go")
		return nil
	})
	<-done
	// Another executor's call is not ex's.
	other := newExecutor(t, drain.Options{})
	if err := other.Run(context.Background(), "other", func(ctx context.Context) error {
		if gotEx, gotName, ok := drain.FromContext(ctx); !ok || gotEx != other || gotName != "other" {
			t.Errorf("FromContext = %p, %q, %v; want the other executor", gotEx, gotName, ok)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestRunStatsBalance(t *testing.T) {
	ex := drain.New(drain.Options{MaxConcurrent: 4})
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			if err := ex.Run(context.Background(), "run", func(context.Context) error {
				runtime.Gosched()
				if i%10 == 0 {
					panic(i)
				}
				return nil
			}); err != nil && i%10 != 0 {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := ex.Stats(); s != (drain.Stats{Started: 100, Finished: 100, Panicked: 10}) {
		t.Errorf("Stats = %+v", s)
	}
}

// oddCtx ends with an error that is neither Canceled nor DeadlineExceeded.
type oddCtx struct {
	context.Context
	done chan struct{}
}

var errOdd = errors.New("odd")

func (c oddCtx) Done() <-chan struct{} { return c.done }
func (c oddCtx) Err() error {
	select {
	case <-c.done:
		return errOdd
	default:
		return nil
	}
}

func TestFnContextKeepsAnOddCallerError(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	// fn's context follows a caller's ctx of its own type as the standard library's
	// contexts do: through Done.
	for _, useDone := range []bool{true} {
		parent := oddCtx{context.Background(), make(chan struct{})}
		err := ex.Run(parent, "odd", func(ctx context.Context) error {
			if useDone {
				ctx.Done() // watch the caller's ctx
			}
			close(parent.done)
			if useDone {
				<-ctx.Done()
			}
			if err := ctx.Err(); err != errOdd {
				t.Errorf("Err = %v, want %v", err, errOdd)
			}
			return ctx.Err()
		})
		if err != errOdd {
			t.Errorf("useDone %v: Run = %v, want %v", useDone, err, errOdd)
		}
	}
}

// TestWhereWithTwoExecutors: each executor's report shows its own calls' lines, though
// both run calls on workers (or runners) of the same slot numbers.
func TestWhereWithTwoExecutors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		exA := drain.New(drain.Options{CancelAfter: -1})
		exB := drain.New(drain.Options{CancelAfter: -1})
		release := make(chan struct{})
		started := make(chan string, 1)
		blockingB := func(context.Context) error {
			started <- lineBelow()
			<-release
			return nil
		}
		mustGo(t, exA, "a", blocking(started, release))
		whereA := <-started
		mustGo(t, exB, "b", blockingB)
		whereB := <-started
		goRun(t, exA, "runA", blocking(started, release))
		whereRunA := <-started
		goRun(t, exB, "runB", blockingB)
		<-started
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for _, tc := range []struct {
			ex    *drain.Executor
			where []string
		}{{exA, []string{whereA, whereRunA}}, {exB, []string{whereB, whereB}}} {
			var pe *drain.PendingError
			if err := tc.ex.Drain(ctx); !errors.As(err, &pe) || len(pe.Pending) != 2 {
				t.Fatalf("Drain = %v", err)
			}
			for i, p := range pe.Pending {
				if p.Where != tc.where[i] {
					t.Errorf("%s: Where = %q, want %q", p.Name, p.Where, tc.where[i])
				}
			}
		}
		close(release)
		for _, ex := range []*drain.Executor{exA, exB} {
			if err := ex.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
