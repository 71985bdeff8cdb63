package drain_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal/nilsink"
)

type ctxKey struct{}

func TestCallReturnsResult(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	want := errors.New("boom")
	if err := ex.Call(context.Background(), "fails", func(context.Context) error { return want }); err != want {
		t.Fatalf("Call = %v, want %v", err, want)
	}
	if err := ex.Call(context.Background(), "works", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Call = %v, want nil", err)
	}
	if got, want := ex.Stats(), (drain.Stats{Started: 2, Finished: 2}); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}

func TestCallDetachesWhenCtxEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan string, 1)
		release := make(chan struct{})
		result := make(chan error, 1)
		go func() { result <- ex.Call(ctx, "slow", blocking(started, release)) }()
		<-started
		cancel()
		if err := <-result; !errors.Is(err, context.Canceled) {
			t.Fatalf("Call = %v, want context.Canceled", err)
		}
		p := ex.Pending()
		if len(p) != 1 || p[0].Name != "slow" || !p[0].Detached {
			t.Fatalf("Pending = %+v, want slow, detached", p)
		}
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		synctest.Wait()
		select {
		case err := <-drained:
			t.Fatalf("Drain returned %v while a detached call runs", err)
		default:
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatalf("Drain = %v", err)
		}
		if s := ex.Stats(); s.Finished != 1 || s.InFlight != 0 {
			t.Errorf("Stats = %+v", s)
		}
	})
}

func TestCallWithDoneCtxRunsNothing(t *testing.T) {
	ex := newExecutor(t, drain.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	if err := ex.Call(ctx, "late", fn); !errors.Is(err, context.Canceled) {
		t.Errorf("Call = %v, want context.Canceled", err)
	}
	if err := ex.Go(ctx, "late", fn); !errors.Is(err, context.Canceled) {
		t.Errorf("Go = %v, want context.Canceled", err)
	}
	if ran {
		t.Error("fn ran")
	}
}

func TestRefusedOnceDraining(t *testing.T) {
	ex := drain.New(drain.Options{})
	select {
	case <-ex.Draining():
		t.Fatal("Draining closed before Drain")
	default:
	}
	if err := ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-ex.Draining()
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	if err := ex.Call(context.Background(), "late", fn); !errors.Is(err, drain.ErrDraining) {
		t.Errorf("Call = %v, want ErrDraining", err)
	}
	if err := ex.Go(context.Background(), "late", fn); !errors.Is(err, drain.ErrDraining) {
		t.Errorf("Go = %v, want ErrDraining", err)
	}
	if ran {
		t.Error("fn ran after refusal")
	}
	if s := ex.Stats(); s.Refused != 2 || s.Started != 0 || s.InFlight != 0 {
		t.Errorf("Stats = %+v", s)
	}
	if msg := drain.ErrDraining.Error(); msg != "executor is draining" {
		t.Errorf("ErrDraining = %q", msg)
	}
}

func TestAdmittedCallRunsAfterDrainBegins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		started := make(chan string, 1)
		release := make(chan struct{})
		if err := ex.Go(context.Background(), "admitted", blocking(started, release)); err != nil {
			t.Fatal(err)
		}
		<-started
		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		<-ex.Draining()
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		if s := ex.Stats(); s.Started != 1 || s.Finished != 1 {
			t.Errorf("Stats = %+v", s)
		}
	})
}

func TestFnContext(t *testing.T) {
	t.Run("carries values and ends with the caller", func(t *testing.T) {
		ex := newExecutor(t, drain.Options{})
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
		deadline := time.Now().Add(time.Hour)
		ctx, cancel2 := context.WithDeadline(ctx, deadline)
		defer cancel2()
		got := make(chan error, 1)
		err := ex.Go(ctx, "ctx", func(fnCtx context.Context) error {
			if v := fnCtx.Value(ctxKey{}); v != "v" {
				t.Errorf("Value = %v", v)
			}
			if d, ok := fnCtx.Deadline(); !ok || !d.Equal(deadline) {
				t.Errorf("Deadline = %v, %v", d, ok)
			}
			if err := fnCtx.Err(); err != nil {
				t.Errorf("Err before cancel = %v", err)
			}
			cancel()
			<-fnCtx.Done()
			got <- fnCtx.Err()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Errorf("fn's Err = %v, want Canceled", err)
		}
	})
	t.Run("Err sees the caller without Done", func(t *testing.T) {
		ex := newExecutor(t, drain.Options{})
		ctx, cancel := context.WithCancel(context.Background())
		err := ex.Call(ctx, "err", func(fnCtx context.Context) error {
			cancel()
			return fnCtx.Err()
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Call = %v", err)
		}
	})
	t.Run("ends when fn returns", func(t *testing.T) {
		ex := newExecutor(t, drain.Options{})
		var kept context.Context
		if err := ex.Call(context.Background(), "keep", func(ctx context.Context) error { kept = ctx; return nil }); err != nil {
			t.Fatal(err)
		}
		<-kept.Done()
		if kept.Err() == nil {
			t.Error("Err = nil after fn returned")
		}
	})
	t.Run("derived contexts follow without a goroutine each", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ex := drain.New(drain.Options{CancelAfter: 3 * time.Second})
			got := make(chan error, 1)
			if err := ex.Go(context.Background(), "derived", func(ctx context.Context) error {
				child, cancel := context.WithTimeout(ctx, time.Hour)
				defer cancel()
				<-child.Done()
				got <- child.Err()
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			go func() {
				if err := ex.Drain(context.Background()); err != nil {
					t.Error(err)
				}
			}()
			time.Sleep(3 * time.Second)
			if err := <-got; !errors.Is(err, context.Canceled) {
				t.Errorf("child Err = %v, want Canceled", err)
			}
		})
	})
}

// cancelledAt starts a call that records when its context ends, drains (with a ctx whose
// deadline is drainFor away, none if 0), and returns how long after the drain began the
// context ended (or -1 if not within 1h).
func cancelledAt(t *testing.T, cancelAfter, drainFor time.Duration) time.Duration {
	var took time.Duration
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: cancelAfter})
		started := make(chan struct{})
		ended := make(chan time.Time, 1)
		if err := ex.Go(context.Background(), "waits", func(ctx context.Context) error {
			close(started)
			select {
			case <-ctx.Done():
				ended <- time.Now()
			case <-time.After(time.Hour):
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		<-started
		begin := time.Now()
		ctx := context.Background()
		if drainFor > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, drainFor)
			defer cancel()
		}
		if err := ex.Drain(ctx); err != nil {
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

// TestCancelAfter: the zero CancelAfter means what it means in runnable.Options, 4/5 of the
// time the drain is given (here Drain's deadline; at once without one); CancelAtOnce
// cancels as the drain begins whatever the deadline.
func TestCancelAfter(t *testing.T) {
	for _, tc := range []struct {
		cancelAfter, drainFor, want time.Duration
	}{
		{0, 0, 0},
		{0, 10 * time.Second, 8 * time.Second},
		{0, 25 * time.Second, 20 * time.Second}, // as runnable's default GracePeriod
		{drain.CancelAtOnce, 0, 0},
		{drain.CancelAtOnce, 10 * time.Second, 0},
		{5 * time.Second, 0, 5 * time.Second},
		{5 * time.Second, 10 * time.Second, 5 * time.Second},
		{-1, 0, -1},
	} {
		if got := cancelledAt(t, tc.cancelAfter, tc.drainFor); got != tc.want {
			t.Errorf("CancelAfter %v, Drain's deadline in %v: context ended after %v, want %v",
				tc.cancelAfter, tc.drainFor, got, tc.want)
		}
	}
}

func TestCancelAfterOnClock(t *testing.T) {
	// Options.Clock drives CancelAfter; the fake clock lets it fire with no real wait.
	fake := clocktesting.NewFakeClock(time.Now())
	ex := newExecutor(t, drain.Options{Clock: fake, CancelAfter: time.Minute})
	started := make(chan struct{})
	if err := ex.Go(context.Background(), "waits", func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	<-started
	drained := make(chan error, 1)
	go func() { drained <- ex.Drain(context.Background()) }()
	<-ex.Draining()
	fake.Step(time.Minute)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
}

func TestDrainReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		started := make(chan string, 2)
		release := make(chan struct{})
		mustGo(t, ex, "a", blocking(started, release))
		mustGo(t, ex, "b", blocking(started, release))
		<-started
		<-started
		drained := make(chan time.Time, 1)
		go func() {
			if err := ex.Drain(context.Background()); err != nil {
				t.Error(err)
			}
			drained <- time.Now()
		}()
		time.Sleep(7 * time.Second) // not a multiple of any interval
		released := time.Now()
		close(release)
		// In a bubble, time stands still while goroutines run: a Drain that polled or
		// waited for a tick would return later than released.
		if at := <-drained; !at.Equal(released) {
			t.Errorf("Drain returned %v after the last call", at.Sub(released))
		}
	})
}

func TestDrainGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{CancelAfter: -1})
		started := make(chan string, 2)
		release := make(chan struct{})
		mustGo(t, ex, "first", blocking(started, release))
		whereFirst := <-started
		mustGo(t, ex, "second", blocking(started, release))
		whereSecond := <-started

		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		errs := make(chan error, 3)
		for range 3 { // concurrent Drains all wait and fail alike
			go func() { errs <- ex.Drain(ctx) }()
		}
		for range 3 {
			err := <-errs
			var pe *drain.PendingError
			if !errors.As(err, &pe) {
				t.Fatalf("Drain = %v, want *PendingError", err)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("errors.Is(%v, DeadlineExceeded) = false", err)
			}
			if len(pe.Pending) != 2 || pe.Pending[0].Name != "first" || pe.Pending[1].Name != "second" {
				t.Fatalf("Pending = %+v", pe.Pending)
			}
			if pe.Pending[0].Where != whereFirst || pe.Pending[1].Where != whereSecond {
				t.Errorf("Where = %q, %q; want %q, %q", pe.Pending[0].Where, pe.Pending[1].Where, whereFirst, whereSecond)
			}
			for _, name := range []string{"first", "second", whereFirst} {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("Error() = %q, does not name %q", err, name)
				}
			}
		}
		if s := ex.Stats(); s.Abandoned != 2 {
			t.Errorf("Abandoned = %d, want 2 (each call once)", s.Abandoned)
		}
		// A later Drain waits again, and succeeds once the calls return.
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatalf("second Drain = %v", err)
		}
	})
}

func TestPanics(t *testing.T) {
	lines := &logs{lines: make(chan logLine, 10)}
	ex := newExecutor(t, drain.Options{Logger: lines.logger(t)})
	err := ex.Call(context.Background(), "panics", func(context.Context) error { panic("oops") })
	var pe *drain.PanicError
	if !errors.As(err, &pe) || pe.Name != "panics" || pe.Value != "oops" || !strings.Contains(string(pe.Stack), "drain_test.TestPanics") {
		t.Fatalf("Call = %#v, want a *PanicError with name, value and stack", err)
	}
	if n := len(lines.get()); n != 0 {
		t.Errorf("a panic returned to Call was also logged (%d lines)", n)
	}

	if err := ex.Go(context.Background(), "goPanics", func(context.Context) error { panic("oops too") }); err != nil {
		t.Fatal(err)
	}
	<-lines.lines
	got := lines.get()
	if len(got) != 1 || got[0].Msg != "Call panicked" || got[0].Call != "goPanics" || got[0].Panic != "oops too" || !strings.Contains(got[0].Stack, "drain_test.TestPanics") {
		t.Errorf("log = %+v", got)
	}
	if s := ex.Stats(); s.Panicked != 2 || s.Finished != 2 {
		t.Errorf("Stats = %+v", s)
	}
}

// A typed-nil Clock or logger sink is nil (quiesce's rule for plug-ins): the real clock,
// and no log, instead of a nil dereference at the first call or report.
func TestTypedNilPlugins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{Clock: (*clocktesting.FakeClock)(nil), Logger: nilsink.Logger(),
			CancelAfter: -1})
		release := make(chan struct{})
		if err := ex.Go(context.Background(), "waits", func(context.Context) error {
			<-release
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // reports at 1s and 6s
		defer cancel()
		if err := ex.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Drain = %v, want DeadlineExceeded", err)
		}
		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
