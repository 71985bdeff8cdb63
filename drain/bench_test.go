package drain_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
)

func nop(context.Context) error { return nil }

// BenchmarkCall and BenchmarkCallBaseline compare Call with the least a caller must do to
// run fn on another goroutine and wait for it: go, a WaitGroup, a channel.
func BenchmarkCall(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer ex.Drain(context.Background())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := ex.Call(ctx, "nop", nop); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCallBaseline(b *testing.B) {
	var wg sync.WaitGroup
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		done := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			done <- nop(ctx)
		}()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}

// BenchmarkCallCancelable is Call with a caller ctx that can end, as a reconcile's can.
func BenchmarkCallCancelable(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer ex.Drain(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if err := ex.Call(ctx, "nop", nop); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCallParallel(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer ex.Drain(context.Background())
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := ex.Call(ctx, "nop", nop); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCallParallelBaseline(b *testing.B) {
	var wg sync.WaitGroup
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			done := make(chan error, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				done <- nop(ctx)
			}()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	})
	wg.Wait()
}

// nopFn is nop behind a variable, so that BenchmarkRunDirect calls it as Run does, not
// inlined.
var nopFn = nop

// BenchmarkRun, BenchmarkRunDirect and BenchmarkCall compare a tracked call on the
// caller's goroutine with calling fn directly and with a hand-off to a worker.
func BenchmarkRun(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer ex.Drain(context.Background())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := ex.Run(ctx, "nop", nop); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRunDirect(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := nopFn(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunCancelable is Run with a caller ctx that can end, as a reconcile's can.
func BenchmarkRunCancelable(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer ex.Drain(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if err := ex.Run(ctx, "nop", nop); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRunParallel(b *testing.B) {
	ex := drain.New(drain.Options{})
	defer ex.Drain(context.Background())
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := ex.Run(ctx, "nop", nop); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkGo and BenchmarkGoErrgroup compare Go with errgroup.Group.Go; each waits for
// all its calls at the end.
func BenchmarkGo(b *testing.B) {
	ex := drain.New(drain.Options{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := ex.Go(ctx, "nop", nop); err != nil {
			b.Fatal(err)
		}
	}
	ex.Drain(context.Background())
}

func BenchmarkGoErrgroup(b *testing.B) {
	var g errgroup.Group
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		g.Go(func() error { return nop(ctx) })
	}
	g.Wait()
}

// BenchmarkDrainWake measures how long Drain takes to return after the last call returned
// (wake-ns), against the time to wake a goroutine blocked on a channel (baseline-ns).
func BenchmarkDrainWake(b *testing.B) {
	var wake, baseline time.Duration
	for b.Loop() {
		ex := drain.New(drain.Options{CancelAfter: -1})
		release := make(chan struct{})
		returned := make(chan time.Time, 1)
		started := make(chan struct{})
		ex.Go(context.Background(), "last", func(context.Context) error {
			close(started)
			<-release
			returned <- time.Now()
			return nil
		})
		<-started
		drained := make(chan time.Time)
		go func() {
			ex.Drain(context.Background())
			drained <- time.Now()
		}()
		<-ex.Draining()
		close(release)
		end := <-drained
		wake += end.Sub(<-returned)

		woken := make(chan time.Time)
		ch := make(chan struct{})
		go func() {
			<-ch
			woken <- time.Now()
		}()
		t0 := time.Now()
		close(ch)
		baseline += (<-woken).Sub(t0)
	}
	b.ReportMetric(float64(wake.Nanoseconds())/float64(b.N), "wake-ns")
	b.ReportMetric(float64(baseline.Nanoseconds())/float64(b.N), "baseline-ns")
}

// BenchmarkReport10k measures one report while 10,000 calls are pending: snapshot, sort,
// one stack capture of every goroutine, and the log line.
func BenchmarkReport10k(b *testing.B) {
	const pending = 10_000
	lines := make(chan struct{}, 1)
	fake := clocktesting.NewFakeClock(time.Now())
	ex := drain.New(drain.Options{
		Clock:       fake,
		CancelAfter: -1,
		ReportEvery: time.Second,
		Logger: (&logs{}).loggerFunc(func(l logLine) {
			if l.Pending != pending || len(l.Calls) != 20 || l.Calls[0].Where == "" {
				b.Errorf("report: pending %d, %d calls, where %q", l.Pending, len(l.Calls), l.Calls[0].Where)
			}
			lines <- struct{}{}
		}),
	})
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(pending)
	for range pending {
		ex.Go(context.Background(), "blocked", func(context.Context) error {
			started.Done()
			<-release
			return nil
		})
	}
	started.Wait()
	drained := make(chan error)
	go func() { drained <- ex.Drain(context.Background()) }()
	<-ex.Draining()
	fake.Step(time.Second) // the first report (ReportAfter)
	<-lines
	for b.Loop() {
		fake.Step(time.Second)
		<-lines
	}
	close(release)
	<-drained
}

// BenchmarkReport10kCaptureFloor is the part of BenchmarkReport10k that the report itself
// cannot avoid: one runtime.GoroutineProfile of the same 10,000 blocked goroutines. Its
// cost grows with the frames on those stacks, spell's included (see spell).
func BenchmarkReport10kCaptureFloor(b *testing.B) {
	const pending = 10_000
	ex := drain.New(drain.Options{CancelAfter: -1})
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(pending)
	for range pending {
		ex.Go(context.Background(), "blocked", func(context.Context) error {
			started.Done()
			<-release
			return nil
		})
	}
	started.Wait()
	records := make([]runtime.StackRecord, pending+100)
	for b.Loop() {
		if _, ok := runtime.GoroutineProfile(records); !ok {
			b.Fatal("too few records")
		}
	}
	close(release)
	ex.Drain(context.Background())
}

// BenchmarkDrainGivesUp10k measures a Drain that gives up while 10,000 calls are pending:
// the *PendingError names all of them, each with its Where.
func BenchmarkDrainGivesUp10k(b *testing.B) {
	const pending = 10_000
	ex := drain.New(drain.Options{CancelAfter: -1})
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(pending)
	for range pending {
		ex.Go(context.Background(), "blocked", func(context.Context) error {
			started.Done()
			<-release
			return nil
		})
	}
	started.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for b.Loop() {
		var pe *drain.PendingError
		if err := ex.Drain(ctx); !errors.As(err, &pe) || len(pe.Pending) != pending || pe.Pending[pending-1].Where == "" {
			b.Fatalf("Drain = %v", err)
		}
	}
	close(release)
	ex.Drain(context.Background())
}
