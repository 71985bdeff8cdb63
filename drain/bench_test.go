package drain_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal/benchpair"
)

func nop(context.Context) error { return nil }

// BenchmarkCall and BenchmarkCallBaseline compare Call with the least a caller must do to
// run fn on another goroutine and wait for it: go, a WaitGroup, a channel.
func BenchmarkCall(b *testing.B) {
	ex := newExecutor(b, drain.Options{})
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
	ex := newExecutor(b, drain.Options{})
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
	ex := newExecutor(b, drain.Options{})
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
	ex := newExecutor(b, drain.Options{})
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
	ex := newExecutor(b, drain.Options{})
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
	ex := newExecutor(b, drain.Options{})
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
	if err := ex.Drain(context.Background()); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkGoErrgroup(b *testing.B) {
	var g errgroup.Group
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		g.Go(func() error { return nop(ctx) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
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
		mustGo(b, ex, "last", func(context.Context) error {
			close(started)
			<-release
			returned <- time.Now()
			return nil
		})
		<-started
		drained := make(chan time.Time)
		go func() {
			if err := ex.Drain(context.Background()); err != nil {
				b.Error(err)
			}
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

// blockedCalls starts n calls that block, each depth frames deep, until release.
func blockedCalls(b *testing.B, ex *drain.Executor, n, depth int) (release func()) {
	ch := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for range n {
		if err := ex.Go(context.Background(), "blocked", func(context.Context) error {
			deep(depth, func() {
				started.Done()
				<-ch
			})
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	started.Wait()
	return func() { close(ch) }
}

// deep calls f depth frames below it.
//
//go:noinline
func deep(depth int, f func()) {
	if depth <= 1 {
		f()
		return
	}
	deep(depth-1, f)
}

// idleGoroutines starts n goroutines that quiesce does not track, blocked until release.
func idleGoroutines(n int) (release func()) {
	ch := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for range n {
		go func() {
			started.Done()
			<-ch
		}()
	}
	started.Wait()
	return func() { close(ch) }
}

// reportCases are the budgets of issue 14: a report of 100 pending calls, of 10,000
// pending calls 150 frames deep, and of 10 pending calls among 10,000 other goroutines.
var reportCases = []struct {
	name                  string
	pending, depth, other int
}{
	{"100", 100, 10, 0},
	{"10000x150", 10_000, 150, 0},
	{"10among10000", 10, 10, 10_000},
}

// BenchmarkReport measures one drain report, each with a fresh capture: the snapshot, one
// goroutine profile (protobuf) parsed, and the log line. Its floor, in the same run, is
// BenchmarkReportFloor.
func BenchmarkReport(b *testing.B) {
	for _, tc := range reportCases {
		b.Run(tc.name, func(b *testing.B) {
			lines, measuring := 0, true
			listed := min(tc.pending, 20)
			ex := drain.New(drain.Options{
				CancelAfter: -1,
				Logger: (&logs{}).loggerFunc(b, func(l logLine) {
					if !measuring { // the final Drain's reports, as the calls return
						return
					}
					// Deeper than the profile keeps (128 frames), a call has its Where, not
					// its Handler.
					if l.Pending != tc.pending || len(l.Calls) != listed || l.Calls[0].Where == drain.Unknown {
						b.Errorf("report: pending %d, %d calls, %+v", l.Pending, len(l.Calls), l.Calls[0])
					}
					lines++
				}),
			})
			release := blockedCalls(b, ex, tc.pending, tc.depth)
			releaseOther := idleGoroutines(tc.other)
			b.ReportAllocs()
			for b.Loop() {
				drain.ReportPending(ex)
			}
			if lines != b.N {
				b.Errorf("%d reports logged, want %d", lines, b.N)
			}
			measuring = false
			releaseOther()
			release()
			if err := ex.Drain(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkReportFloor is, for the cases of BenchmarkReport, what no report can avoid:
// runtime.GoroutineProfile ("runtime", no labels, the raw floor), and the goroutine
// profile with labels written in its protobuf form ("pprof").
func BenchmarkReportFloor(b *testing.B) {
	for _, tc := range reportCases {
		ex := drain.New(drain.Options{CancelAfter: -1})
		release := blockedCalls(b, ex, tc.pending, tc.depth)
		releaseOther := idleGoroutines(tc.other)
		b.Run("runtime/"+tc.name, func(b *testing.B) {
			records := make([]runtime.StackRecord, tc.pending+tc.other+100)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := runtime.GoroutineProfile(records); !ok {
					b.Fatal("too few records")
				}
			}
		})
		b.Run("pprof/"+tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := pprof.Lookup("goroutine").WriteTo(io.Discard, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
		releaseOther()
		release()
		if err := ex.Drain(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDrainGivesUp10k measures a Drain that gives up while 10,000 calls are pending:
// the *PendingError names all of them, each with its Where.
func BenchmarkDrainGivesUp10k(b *testing.B) {
	const pending = 10_000
	ex := drain.New(drain.Options{CancelAfter: -1})
	release := blockedCalls(b, ex, pending, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.ReportAllocs()
	for b.Loop() {
		drain.ForgetCapture()
		var pe *drain.PendingError
		if err := ex.Drain(ctx); !errors.As(err, &pe) || len(pe.Pending) != pending || pe.Pending[pending-1].Where == drain.Unknown {
			b.Fatalf("Drain = %v", err)
		}
	}
	release()
	if err := ex.Drain(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// The pairs of the budgets of issue 14, each measured right next to its baseline. -count N
// runs each half N times in a row: to alternate them on a busy machine, run the test
// binary N times with -test.count 1, and compare the medians of the per-run ratios.

func BenchmarkPairCall(b *testing.B) {
	b.Run("Call", BenchmarkCall)
	b.Run("baseline", BenchmarkCallBaseline)
}

func BenchmarkPairGo(b *testing.B) {
	b.Run("Go", BenchmarkGo)
	b.Run("errgroup", BenchmarkGoErrgroup)
}

func BenchmarkPairRun(b *testing.B) {
	b.Run("Run", BenchmarkRun)
	b.Run("direct", BenchmarkRunDirect)
}

// BenchmarkCallInterleaved runs Call and its baseline (BenchmarkCallBaseline's go,
// WaitGroup and channel) alternately, in blocks short enough that both see the same load
// on a busy machine, and reports the median over the blocks of each one's ns/op and of
// their ratio (call/baseline: the budget of issue 23 is 1.8).
func BenchmarkCallInterleaved(b *testing.B) {
	ex := newExecutor(b, drain.Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	_, _, ratio := benchpair.Interleaved(b, 200, "call", func(n int) {
		for range n {
			if err := ex.Call(ctx, "nop", nop); err != nil {
				b.Fatal(err)
			}
		}
	}, "baseline", func(n int) {
		for range n {
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
	b.ReportMetric(ratio, "call/baseline")
	b.ReportMetric(testing.AllocsPerRun(100, func() { _ = ex.Call(ctx, "nop", nop) }), "call-allocs/op")
	b.ReportMetric(testing.AllocsPerRun(100, func() {
		done := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			done <- nop(ctx)
		}()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}), "baseline-allocs/op")
	wg.Wait()
}

// BenchmarkGoInterleaved runs Go and errgroup.Group.Go (BenchmarkGoErrgroup's baseline)
// alternately, in blocks, each block waiting for its own calls (Drain is once per executor:
// each of Go's blocks makes an executor of its own and drains it, as errgroup's makes a
// Group and waits for it). It reports the median over the blocks of each one's ns/op and of
// their ratio (go/errgroup: the budget of issue 31 is 3).
func BenchmarkGoInterleaved(b *testing.B) {
	ctx := context.Background()
	_, _, ratio := benchpair.Interleaved(b, 200, "go", func(n int) {
		ex := drain.New(drain.Options{})
		for range n {
			if err := ex.Go(ctx, "nop", nop); err != nil {
				b.Fatal(err)
			}
		}
		if err := ex.Drain(context.Background()); err != nil {
			b.Fatal(err)
		}
	}, "errgroup", errgroupBlock(ctx, b))
	b.ReportMetric(ratio, "go/errgroup")
	// Allocations per Go on an executor whose label ids exist (the blocks made them).
	ex := drain.New(drain.Options{})
	var wg sync.WaitGroup
	fn := func(ctx context.Context) error {
		defer wg.Done()
		return nop(ctx)
	}
	b.ReportMetric(testing.AllocsPerRun(100, func() {
		wg.Add(1)
		if err := ex.Go(ctx, "nop", fn); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
	}), "go-allocs/op")
	if err := ex.Drain(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGoSteadyInterleaved is BenchmarkGoInterleaved with one executor for every block,
// as an operator has one for its process: no New and no Drain per block. A block waits for
// its calls by a WaitGroup that fn counts down, as errgroup.Group waits for its own. It
// reports the same metrics, for comparison (the budget is BenchmarkGoInterleaved's).
func BenchmarkGoSteadyInterleaved(b *testing.B) {
	ctx := context.Background()
	ex := drain.New(drain.Options{})
	b.Cleanup(func() { _ = ex.Drain(context.Background()) })
	var wg sync.WaitGroup
	fn := func(ctx context.Context) error {
		defer wg.Done()
		return nop(ctx)
	}
	_, _, ratio := benchpair.Interleaved(b, 200, "go", func(n int) {
		wg.Add(n)
		for range n {
			if err := ex.Go(ctx, "nop", fn); err != nil {
				b.Fatal(err)
			}
		}
		wg.Wait()
	}, "errgroup", errgroupBlock(ctx, b))
	b.ReportMetric(ratio, "go/errgroup")
}

// BenchmarkReportInterleaved runs a drain report of 10,000 pending calls 150 frames deep
// (a fresh capture each time, as BenchmarkReport) and its floor (the goroutine profile
// written in its protobuf form, as BenchmarkReportFloor's "pprof"), alternately, and
// reports the medians of each one's time and of their ratio (report/floor: the budget of
// issue 23 is 2).
func BenchmarkReportInterleaved(b *testing.B) {
	const pending, depth = 10_000, 150
	lines, measuring := 0, true
	ex := drain.New(drain.Options{
		CancelAfter: -1,
		Logger: (&logs{}).loggerFunc(b, func(l logLine) {
			if !measuring { // the final Drain's reports, as the calls return
				return
			}
			if l.Pending != pending || len(l.Calls) != 20 || l.Calls[0].Where == drain.Unknown {
				b.Errorf("report: pending %d, %d calls, %+v", l.Pending, len(l.Calls), l.Calls[0])
			}
			lines++
		}),
	})
	release := blockedCalls(b, ex, pending, depth)
	_, _, ratio := benchpair.Interleaved(b, 1, "report", func(n int) {
		for range n {
			drain.ReportPending(ex)
		}
	}, "floor", func(n int) {
		for range n {
			if err := pprof.Lookup("goroutine").WriteTo(io.Discard, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.ReportMetric(ratio, "report/floor")
	if lines != b.N {
		b.Errorf("%d reports logged, want %d", lines, b.N)
	}
	measuring = false
	release()
	if err := ex.Drain(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// errgroupBlock is the baseline of the Go pairs: n calls of nop through an errgroup.Group,
// waited for.
func errgroupBlock(ctx context.Context, b *testing.B) func(n int) {
	return func(n int) {
		var g errgroup.Group
		for range n {
			g.Go(func() error { return nop(ctx) })
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
	}
}
