package drain_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

func TestMaxConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{MaxConcurrent: 2, CancelAfter: -1})
		var running, peak atomic.Int32
		release := make(chan struct{})
		fn := countingPeak(&running, &peak, release)
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Go(func() {
				if err := ex.Go(context.Background(), fmt.Sprint("go-", i), fn); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait()
		if n := running.Load(); n != 2 {
			t.Errorf("%d running, want 2", n)
		}
		// Callers waiting for a slot are not admitted yet: not in flight, not pending.
		if s := ex.Stats(); s.InFlight != 2 || s.Started != 2 {
			t.Errorf("Stats = %+v, want 2 in flight and started (3 waiting for a slot)", s)
		}
		if n := len(ex.Pending()); n != 2 {
			t.Errorf("%d pending, want 2", n)
		}

		// A waiting caller honours its ctx.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := ex.Call(ctx, "times out", fn); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Call = %v, want DeadlineExceeded", err)
		}

		close(release)
		wg.Wait()
		synctest.Wait()
		if p := peak.Load(); p != 2 {
			t.Errorf("peak %d running, want 2", p)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// countingPeak returns an fn that counts itself in running while it blocks until release is
// closed, and raises peak to the most calls it saw running at once.
func countingPeak(running, peak *atomic.Int32, release <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		return nil
	}
}

func TestMaxConcurrentWaiterRefusedByDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{MaxConcurrent: 1, CancelAfter: -1})
		started := make(chan string, 1)
		release := make(chan struct{})
		mustGo(t, ex, "holds the slot", blocking(started, release))
		<-started
		ran := false
		results := make(chan error, 2)
		go func() {
			results <- ex.Call(context.Background(), "waits", func(context.Context) error { ran = true; return nil })
		}()
		go func() {
			results <- ex.Go(context.Background(), "waits too", func(context.Context) error { ran = true; return nil })
		}()
		synctest.Wait()
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		for range 2 {
			if err := <-results; !errors.Is(err, drain.ErrDraining) {
				t.Errorf("waiting caller got %v, want ErrDraining", err)
			}
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if ran {
			t.Error("a refused call ran")
		}
		if s := ex.Stats(); s.Refused != 2 || s.Started != 1 || s.InFlight != 0 {
			t.Errorf("Stats = %+v", s)
		}
	})
}

func TestNegativeMaxConcurrentIsUnbounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{MaxConcurrent: -1})
		started := make(chan string, 10)
		release := make(chan struct{})
		for range 10 {
			mustGo(t, ex, "x", blocking(started, release))
		}
		for range 10 {
			<-started
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBadInput(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	fn := func(context.Context) error { return nil }
	for _, tc := range []struct {
		name string
		ctx  context.Context
		fn   func(context.Context) error
	}{
		{"", context.Background(), fn},
		{"nil fn", context.Background(), nil},
		{"nil ctx", nil, fn},
	} {
		if err := ex.Call(tc.ctx, tc.name, tc.fn); !errors.Is(err, drain.ErrInvalidCall) {
			t.Errorf("Call(%q) = %v, want ErrInvalidCall", tc.name, err)
		}
		if err := ex.Go(tc.ctx, tc.name, tc.fn); !errors.Is(err, drain.ErrInvalidCall) {
			t.Errorf("Go(%q) = %v, want ErrInvalidCall", tc.name, err)
		}
	}
	if s := ex.Stats(); s != (drain.Stats{}) {
		t.Errorf("bad input counted: %+v", s)
	}
}

func TestAfterCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type seen struct {
			name string
			took time.Duration
			err  error
		}
		var got []seen
		var mu sync.Mutex
		ex := drain.New(drain.Options{})
		internal.Of(ex).Settings().AfterCall = func(controller string, took time.Duration, err error) {
			mu.Lock()
			got = append(got, seen{controller, took, err})
			mu.Unlock()
		}
		boom := errors.New("boom")
		// The calls' results reach AfterCall, which is what this test checks.
		_ = internal.Of(ex).Call(context.Background(), internal.CallOptions{Name: "sleeps", Controller: "c1"}, func(context.Context) error { time.Sleep(3 * time.Second); return boom })
		_ = ex.Call(context.Background(), "panics", func(context.Context) error { panic(1) })
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		var pe *drain.PanicError
		if len(got) != 2 || got[0] != (seen{"c1", 3 * time.Second, boom}) || got[1].name != "" || !errors.As(got[1].err, &pe) {
			t.Errorf("AfterCall saw %+v", got)
		}
	})
}

func TestAfterCallPanicIsContained(t *testing.T) {
	lines := &logs{}
	ex := newExecutor(t, drain.Options{Logger: lines.logger(t)})
	internal.Of(ex).Settings().AfterCall = func(string, time.Duration, error) { panic("bad hook") }
	if err := ex.Call(context.Background(), "x", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got := lines.get(); len(got) != 1 || got[0].Msg != "AfterCall panicked" {
		t.Errorf("log = %+v", got)
	}
}

func TestGoexit(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	err := ex.Call(context.Background(), "exits", func(context.Context) error { runtime.Goexit(); return nil })
	if err == nil {
		t.Fatal("Call = nil after runtime.Goexit")
	}
	// The executor still works, and counts the call as finished.
	if err := ex.Call(context.Background(), "after", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if s := ex.Stats(); s.Finished != 2 || s.InFlight != 0 {
		t.Errorf("Stats = %+v", s)
	}
}

func TestStress(t *testing.T) {
	const calls = 10_000
	for round := range 5 {
		// Odd rounds also make callers wait for one of 64 slots.
		ex := drain.New(drain.Options{CancelAfter: -1, MaxConcurrent: round % 2 * 64})
		var ran [calls]atomic.Bool
		var results [calls]error
		var wg sync.WaitGroup
		// The drain begins once target calls were attempted: the rest race it.
		target := int32(1000 + round*2000)
		var attempts atomic.Int32
		trigger := make(chan struct{})
		for i := range calls {
			wg.Go(func() {
				if attempts.Add(1) == target {
					close(trigger)
				}
				fn := func(context.Context) error {
					if ran[i].Swap(true) {
						t.Errorf("call %d ran twice", i)
					}
					runtime.Gosched()
					return nil
				}
				switch i % 3 {
				case 0:
					results[i] = ex.Call(context.Background(), "call", fn)
				case 1:
					results[i] = ex.Go(context.Background(), "go", fn)
				default:
					results[i] = ex.Run(context.Background(), "run", fn)
				}
			})
		}
		<-trigger
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Every call admitted before refusal has run by now; none runs later.
		var done int
		for i := range calls {
			if ran[i].Load() {
				done++
			}
		}
		wg.Wait()
		var completed, refused uint64
		for i := range calls {
			switch err := results[i]; {
			case err == nil:
				completed++
				if !ran[i].Load() {
					t.Fatalf("round %d: call %d admitted but never ran", round, i)
				}
			case errors.Is(err, drain.ErrDraining):
				refused++
				if ran[i].Load() {
					t.Fatalf("round %d: call %d ran after it was refused", round, i)
				}
			default:
				t.Fatalf("round %d: call %d: %v", round, i, err)
			}
		}
		if uint64(done) != completed {
			t.Fatalf("round %d: %d fn ran before Drain returned, %d completed", round, done, completed)
		}
		s := ex.Stats()
		if s.Started != completed || s.Finished != completed || s.Refused != refused || s.InFlight != 0 || completed+refused != calls {
			t.Fatalf("round %d: Stats %+v; %d completed, %d refused", round, s, completed, refused)
		}
		t.Logf("round %d: %d completed, %d refused", round, completed, refused)
	}
}

// MaxConcurrent bounds reconciles and their calls: a call nested in a call holding a slot
// runs in that slot (no self-deadlock with MaxConcurrent 1), and daemons and webhook calls
// (internal.CallOptions Daemon, NoSlot), and the calls nested in them, never wait for nor
// hold one.
func TestMaxConcurrentSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{MaxConcurrent: 1, CancelAfter: -1})
		core := internal.Of(ex)
		release := make(chan struct{})
		blocked := func(context.Context) error { <-release; return nil }

		// A daemon and a webhook call run while the only slot is free, and hold none.
		if err := core.Go(context.Background(), internal.CallOptions{Name: "a daemon", Daemon: true}, blocked); err != nil {
			t.Fatal(err)
		}
		if err := core.Go(context.Background(), internal.CallOptions{Name: "webhook", NoSlot: true}, blocked); err != nil {
			t.Fatal(err)
		}
		// A reconcile takes the slot; its nested calls run in it.
		nested := make(chan error, 1)
		done := make(chan error, 1)
		go func() {
			done <- ex.Run(context.Background(), "reconcile", func(ctx context.Context) error {
				nested <- ex.Call(ctx, "reconcile/inner", func(ctx context.Context) error {
					return ex.Call(ctx, "reconcile/inner/deeper", func(context.Context) error { return nil })
				})
				<-release
				return nil
			})
		}()
		if err := <-nested; err != nil {
			t.Fatalf("nested Call with MaxConcurrent 1 = %v", err)
		}
		synctest.Wait()
		// The slot is the reconcile's: another reconcile waits, and honours its context.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := ex.Call(ctx, "other", blocked); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a second top-level call = %v, want to wait for the slot until its deadline", err)
		}
		// Still, a daemon and a webhook call start at once, and so do the calls nested in
		// them (reconcilers.Call in an admission handler or a daemon): they run where their
		// outer call runs, in no slot.
		for _, o := range []internal.CallOptions{{Name: "webhook2", NoSlot: true}, {Name: "daemon2", Daemon: true}} {
			if err := core.Run(context.Background(), o, func(ctx context.Context) error {
				return ex.Call(ctx, o.Name+"/inner", func(ctx context.Context) error {
					return ex.Call(ctx, o.Name+"/inner/deeper", func(context.Context) error { return nil })
				})
			}); err != nil {
				t.Errorf("%s and its nested calls with the slot taken = %v", o.Name, err)
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// Every slot was given back: a top-level call runs at once.
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
		defer cancel2()
		if err := ex.Call(ctx2, "after", func(context.Context) error { return nil }); err != nil {
			t.Errorf("a call after everything returned = %v, want a free slot", err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// A positive ReportAfter, ReportEvery or SlowAfter below its least value is refused at
// setup, naming the field (issue 43: 1ns gave thousands of stack captures per second); the
// least values themselves, 0 (the default) and negative values are accepted.
func TestNewRefusesIntervalsBelowTheirLeastValue(t *testing.T) {
	for field, opts := range map[string]drain.Options{
		"ReportAfter": {ReportAfter: time.Nanosecond},
		"ReportEvery": {ReportEvery: time.Nanosecond},
		"SlowAfter":   {SlowAfter: time.Nanosecond},
	} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "Options."+field) {
					t.Errorf("New with %s 1ns: recovered %v, want a panic naming Options.%s", field, v, field)
				}
			}()
			drain.New(opts)
		}()
	}
	for _, opts := range []drain.Options{
		{ReportAfter: drain.MinReportAfter, ReportEvery: drain.MinReportEvery, SlowAfter: drain.MinSlowAfter},
		{ReportAfter: -1, ReportEvery: -1, SlowAfter: -1},
		{},
	} {
		newExecutor(t, opts)
	}
}
