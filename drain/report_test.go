package drain_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
)

func TestReportSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1})
		started := make(chan string, 1)
		releaseA, releaseB := make(chan struct{}), make(chan struct{})
		mustGo(t, ex, "a", blocking(started, releaseA))
		whereA := <-started
		time.Sleep(2 * time.Second)

		// b's caller stops waiting: b is detached.
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			if err := ex.Call(ctx, "b", blocking(started, releaseB)); !errors.Is(err, context.Canceled) {
				t.Errorf("Call = %v, want Canceled", err)
			}
		}()
		whereB := <-started
		cancel()

		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		// The drain began at 2s. Expect reports at 3s and 8s with a and b, at 13s with
		// b alone (a returns at 10s), and none after b returns at 14s.
		expect := func(at time.Duration, want ...reportRow) {
			t.Helper()
			synctest.Wait()
			got := lines.get()
			if len(got) != 1 {
				t.Fatalf("at %v: %d log lines, want 1: %+v", at, len(got), got)
			}
			line := got[0]
			if line.Msg != "Waiting for pending calls" || line.Pending != len(want) || line.More != 0 || fmt.Sprint(line.Calls) != fmt.Sprint(want) {
				t.Errorf("at %v: report\n %s\nwant pending %d, calls %+v", at, line.raw, len(want), want)
			}
			lines.all = nil
		}
		expectNone := func(at time.Duration) {
			t.Helper()
			synctest.Wait()
			if got := lines.get(); len(got) != 0 {
				t.Fatalf("at %v: %d unexpected log lines: %+v", at, len(got), got)
			}
		}
		time.Sleep(time.Second - time.Nanosecond)
		expectNone(3*time.Second - time.Nanosecond)
		time.Sleep(time.Nanosecond)
		expect(3*time.Second, reportRow{"a", "3s", true, whereA, whereA}, reportRow{"b", "1s", true, whereB, whereB})
		time.Sleep(5*time.Second - time.Nanosecond)
		expectNone(8*time.Second - time.Nanosecond)
		time.Sleep(time.Nanosecond)
		expect(8*time.Second, reportRow{"a", "8s", true, whereA, whereA}, reportRow{"b", "6s", true, whereB, whereB})
		time.Sleep(2 * time.Second)
		close(releaseA)
		expectNone(10 * time.Second)
		time.Sleep(3 * time.Second)
		expect(13*time.Second, reportRow{"b", "11s", true, whereB, whereB})
		time.Sleep(time.Second)
		close(releaseB)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		expectNone(time.Minute)
	})
}

func TestReportShowsWaitingCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1, ReportAfter: time.Minute})
		started := make(chan string, 1)
		release := make(chan struct{})
		go func() {
			if err := ex.Call(context.Background(), "waited", blocking(started, release)); err != nil {
				t.Error(err)
			}
		}()
		where := <-started
		drainInBackground(t, ex)
		time.Sleep(time.Minute)
		synctest.Wait()
		got := lines.get()
		want := fmt.Sprint([]reportRow{{"waited", oneMinute, false, where, where}})
		if len(got) != 1 || fmt.Sprint(got[0].Calls) != want {
			t.Errorf("reports %+v, want one with %s", got, want)
		}
		close(release)
	})
}

func TestNoReportWhenNothingPends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1})
		release := make(chan struct{})
		started := make(chan string, 1)
		mustGo(t, ex, "quick", blocking(started, release))
		<-started
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		time.Sleep(time.Second - time.Nanosecond)
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := lines.get(); len(got) != 0 {
			t.Errorf("logged %+v", got)
		}
		// A drain with nothing in flight logs nothing either.
		ex2 := drain.New(drain.Options{Logger: lines.logger(t)})
		if err := ex2.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := lines.get(); len(got) != 0 {
			t.Errorf("logged %+v", got)
		}
	})
}

func TestReportIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1})
		release := make(chan struct{})
		started := make(chan string, 25)
		for i := range 25 {
			mustGo(t, ex, fmt.Sprintf("call-%02d", i), blocking(started, release))
			<-started
			time.Sleep(time.Second)
		}
		drainInBackground(t, ex)
		time.Sleep(time.Second)
		synctest.Wait()
		got := lines.get()
		if len(got) != 1 {
			t.Fatalf("%d lines", len(got))
		}
		if got[0].Pending != 25 || got[0].More != 5 || len(got[0].Calls) != 20 {
			t.Errorf("pending %d, more %d, %d calls; want 25, 5, 20", got[0].Pending, got[0].More, len(got[0].Calls))
		}
		for i, c := range got[0].Calls { // oldest first
			if want := fmt.Sprintf("call-%02d", i); c.Name != want || c.Age != fmt.Sprintf("%ds", 26-i) {
				t.Errorf("calls[%d] = %+v, want %s aged %ds", i, c, want, 26-i)
			}
		}
		close(release)
	})
}

func TestReportDefaultsForBadDurations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1, ReportAfter: -time.Second, ReportEvery: -time.Second})
		release := make(chan struct{})
		started := make(chan string, 1)
		mustGo(t, ex, "x", blocking(started, release))
		<-started
		drainInBackground(t, ex)
		// Negative durations take the defaults: reports at 1s, 6s, 11s.
		for _, wait := range []time.Duration{time.Second, 5 * time.Second, 5 * time.Second} {
			time.Sleep(wait - time.Nanosecond)
			synctest.Wait()
			if n := len(lines.get()); n != 0 {
				t.Fatalf("%d reports too early", n)
			}
			time.Sleep(time.Nanosecond)
			synctest.Wait()
			if n := len(lines.get()); n != 1 {
				t.Fatalf("%d reports, want 1", n)
			}
			lines.all = nil
		}
		close(release)
	})
}

func TestReportOnFakeClock(t *testing.T) {
	lines := &logs{lines: make(chan logLine, 1)}
	fake := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ex := newExecutor(t, drain.Options{Logger: lines.logger(t), Clock: fake, CancelAfter: -1, ReportAfter: 2 * time.Second})
	release := make(chan struct{})
	started := make(chan string, 1)
	mustGo(t, ex, "x", blocking(started, release))
	where := <-started
	drainInBackground(t, ex)
	<-ex.Draining()
	fake.Step(2 * time.Second)
	line := <-lines.lines
	if want := fmt.Sprint([]reportRow{{"x", "2s", true, where, where}}); fmt.Sprint(line.Calls) != want {
		t.Errorf("report %s, want calls %s", line.raw, want)
	}
	close(release)
}

// TestNoReportAfterTheEnd: a report falling due at the very moment a Drain gives up is
// either logged before Drain returns, or not at all; so is one when the last call returns.
func TestNoReportAfterTheEnd(t *testing.T) {
	for i := range 20 {
		synctest.Test(t, func(t *testing.T) {
			lines := &logs{}
			log := lines.logger(t)
			fake := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			ex := drain.New(drain.Options{Logger: log, Clock: fake, CancelAfter: -1, ReportAfter: time.Second, ReportEvery: time.Second})
			release := make(chan struct{})
			started := make(chan string, 1)
			mustGo(t, ex, "x", blocking(started, release))
			<-started
			ctx, cancel := context.WithCancel(context.Background())
			fake.AfterFunc(3*time.Second, cancel) // the grace period ends with the third report
			result := make(chan error, 1)
			go func() { result <- ex.Drain(ctx) }()
			<-ex.Draining()
			synctest.Wait()
			for range 3 {
				fake.Step(time.Second)
				synctest.Wait()
			}
			var pe *drain.PendingError
			if err := <-result; !errors.As(err, &pe) {
				t.Fatalf("Drain = %v, want a *PendingError", err)
			}
			log.Info("Abandoned")
			synctest.Wait() // whatever the drain left running has run
			fake.Step(time.Minute)
			synctest.Wait()
			got := lines.get()
			if last := got[len(got)-1]; last.Msg != "Abandoned" {
				t.Errorf("run %d: a line followed the end of the drain: %s", i, last.raw)
			}
			if n := len(got); n < 3 || n > 4 {
				t.Errorf("run %d: %d lines, want 2 or 3 reports and the end", i, n)
			}
			close(release)
			if err := ex.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestNothingLeftBehind: once a Drain returned, having given up, the executor runs no
// goroutine of its own; only the hung call's remains.
func TestNothingLeftBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		before := goleak.IgnoreCurrent()
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: -1, ReportAfter: time.Second, ReportEvery: time.Second})
		release := make(chan struct{})
		hung := func(context.Context) error { <-release; return nil }
		mustGo(t, ex, "hung", hung)
		ctx, cancel := context.WithTimeout(context.Background(), 5500*time.Millisecond)
		defer cancel()
		if err := ex.Drain(ctx); err == nil {
			t.Fatal("Drain = nil, want a *PendingError")
		}
		synctest.Wait()
		n := len(lines.get())
		if err := goleak.Find(before, goleak.IgnoreAnyFunction(funcName(hung))); err != nil {
			t.Errorf("after Drain gave up: %v", err)
		}
		time.Sleep(time.Hour)
		if got := len(lines.get()); got != n || n != 5 {
			t.Errorf("%d report lines during the drain, %d after, want 5 and none", n, got-n)
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
