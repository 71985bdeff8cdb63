package runnable_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.uber.org/goleak"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/internal/nilsink"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// stopBegan is the message of the stop's first line.
const stopBegan = "Stop began"

func TestMain(m *testing.M) {
	// controller-runtime's logger, the zero Options.Logger's: every line, with its name.
	logf.SetLogger(funcr.New(func(prefix, args string) {
		crLog.mu.Lock()
		defer crLog.mu.Unlock()
		crLog.lines = append(crLog.lines, prefix+" "+args)
	}, funcr.Options{}))
	goleak.VerifyTestMain(m)
}

// crLog holds the lines logged to controller-runtime's logger (log.Log).
var crLog capture

// capture records each log line as funcr renders it.
type capture struct {
	mu    sync.Mutex
	lines []string
}

func (c *capture) logger() logr.Logger { return c.loggerV(0) }

// loggerV logs the lines up to verbosity v.
func (c *capture) loggerV(v int) logr.Logger {
	return funcr.New(func(_, args string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, args)
	}, funcr.Options{Verbosity: v})
}

func (c *capture) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// messages returns the "msg" of each line, in order.
func messages(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		_, after, _ := strings.Cut(l, `"msg"="`)
		out[i], _, _ = strings.Cut(after, `"`)
	}
	return out
}

// The Runnable runs on every replica: fencing comes from the lease, not from its group.
func TestNeedLeaderElection(t *testing.T) {
	if runnable.NewUnmanaged(runnable.Options{}).NeedLeaderElection() {
		t.Error("NeedLeaderElection = true, want false")
	}
}

// What New returns cannot be given to mgr.Add: nothing would fence its shielded calls.
// Fails on v0.3.0, whose New returned a *Runnable.
func TestNewIsNotAManagerRunnable(t *testing.T) {
	if _, ok := any(runnable.New(runnable.Options{})).(manager.Runnable); ok {
		t.Error("New returns a manager.Runnable")
	}
}

// Run drains when its context ends: it waits for the calls, then Done is closed and Err is
// the result; a second Run fails at once.
func TestRunnerRunDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := runnable.New(runnable.Options{Logger: logr.Discard(), CancelAfter: -1, GracePeriod: 10 * time.Second})
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- q.Run(ctx) }()
		if err := q.Executor().Go(context.Background(), "job", func(context.Context) error {
			time.Sleep(3 * time.Second)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		stop()
		if err := <-ran; err != nil || time.Since(begin) != 3*time.Second {
			t.Fatalf("Run = %v after %v, want nil once the call returned (3s)", err, time.Since(begin))
		}
		if !internal.Closed(q.Done()) || q.Err() != nil {
			t.Fatalf("after Run: Done closed %v, Err %v; want closed, nil", internal.Closed(q.Done()), q.Err())
		}
		if err := q.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already started") {
			t.Fatalf("second Run = %v, want already started", err)
		}
	})
}

// A drain that abandons calls: Run and Err return the error wrapping *drain.PendingError.
func TestRunnerRunReportsAbandonedCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := runnable.New(runnable.Options{Logger: logr.Discard(), CancelAfter: -1, GracePeriod: 2 * time.Second})
		release := make(chan struct{})
		if err := q.Executor().Go(context.Background(), "stuck", func(context.Context) error {
			<-release
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		stop()
		err := q.Run(ctx)
		var pe *drain.PendingError
		if !errors.As(err, &pe) || len(pe.Pending) != 1 || pe.Pending[0].Name != "stuck" || !errors.Is(q.Err(), err) {
			t.Fatalf("Run = %v, Err = %v; want the abandoned call \"stuck\"", err, q.Err())
		}
		close(release)
		synctest.Wait()
	})
}

func TestStartDrainsWhenAllCallsReturnInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.NewUnmanaged(runnable.Options{Logger: logs.logger(), CancelAfter: -1, GracePeriod: 10 * time.Second})
		ctx, stop := context.WithCancel(context.Background())
		started := make(chan error, 1)
		go func() { started <- r.Start(ctx) }()
		synctest.Wait()
		if !internal.Of(r.Executor()).Settings().Owned {
			t.Fatal("a Runnable does not own its executor")
		}
		if err := r.ReadyzCheck(nil); err != nil {
			t.Fatalf("ReadyzCheck before the drain = %v", err)
		}
		if err := r.Executor().Go(context.Background(), "job", func(context.Context) error {
			time.Sleep(3 * time.Second)
			return nil
		}); err != nil {
			t.Fatal(err)
		}

		begin := time.Now()
		stop()
		synctest.Wait()
		if err := r.ReadyzCheck(nil); err != nil {
			t.Errorf("ReadyzCheck while draining with no ShutdownDelay = %v, want nil", err)
		}
		select {
		case <-r.Done():
			t.Fatal("Start returned while a call was pending")
		default:
		}
		if err := <-started; err != nil {
			t.Fatalf("Start = %v, want nil", err)
		}
		if took := time.Since(begin); took != 3*time.Second {
			t.Fatalf("Start returned %v after its ctx ended, want 3s (when the call returned)", took)
		}
		if err := r.Err(); err != nil {
			t.Fatalf("Err = %v", err)
		}
		want := []string{stopBegan, "Draining executor", "Waiting for pending calls", "All calls returned"}
		if got := messages(logs.all()); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("log messages = %q, want %q", got, want)
		}
	})
}

func TestStartAbandonsCallsAfterTheGracePeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.NewUnmanaged(runnable.Options{Logger: logs.logger(), CancelAfter: -1, GracePeriod: 4 * time.Second})
		ctx, stop := context.WithCancel(context.Background())
		result := make(chan error, 1)
		go func() { result <- r.Start(ctx) }()
		synctest.Wait()
		release := make(chan struct{})
		for _, name := range []string{"ctrl/ns/a/hang", "ctrl/ns/b/hang"} {
			if err := r.Executor().Go(context.Background(), name, func(context.Context) error {
				<-release // ignores its context
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		begin := time.Now()
		stop()
		err := <-result
		if took := time.Since(begin); took != 4*time.Second {
			t.Fatalf("Start returned %v after its ctx ended, want the 4s grace period", took)
		}
		var pe *drain.PendingError
		if !errors.As(err, &pe) || len(pe.Pending) != 2 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Start = %v, want a *drain.PendingError of 2 calls and DeadlineExceeded", err)
		}
		if !errors.Is(r.Err(), err) {
			t.Fatalf("Err = %v, want what Start returned", r.Err())
		}
		lines := logs.all()
		last := lines[len(lines)-1]
		for _, want := range []string{`"msg"="Abandoned calls still running after the grace period"`, `"abandoned"=2`,
			`"error"="context deadline exceeded"`, `"name"="ctrl/ns/a/hang"`, `"name"="ctrl/ns/b/hang"`, `"age"="4s"`,
			"runnable_test.TestStartAbandonsCallsAfterTheGracePeriod"} {
			if !strings.Contains(last, want) {
				t.Errorf("last log line %s\nlacks %s", last, want)
			}
		}
		// The error counts the calls and points at the log that lists them.
		for _, want := range []string{"failed to drain quiesce executor", "2 call(s) still running after the grace period of 4s",
			"listed in quiesce's log"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Start's error %q lacks %q", err, want)
			}
		}
		if strings.Contains(err.Error(), "ctrl/ns/a/hang") || strings.Contains(err.Error(), "Abandoned calls") {
			t.Errorf("Start's error %q names the calls the log already lists, or quotes the line's message", err)
		}
		if s := r.Executor().Stats(); s.Abandoned != 2 {
			t.Errorf("Abandoned = %d, want 2", s.Abandoned)
		}
		close(release)
		// The abandoned calls still run: wait for them, or goleak would see them.
		if err := r.Executor().Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestStartWithNothingPendingLogsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.NewUnmanaged(runnable.Options{Logger: logs.logger()})
		ctx, stop := context.WithCancel(context.Background())
		stop()
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if lines := logs.all(); len(lines) != 0 {
			t.Fatalf("log = %q, want nothing at verbosity 0", lines)
		}
	})
}

func TestStartTwiceOrAfterTheDrainFails(t *testing.T) {
	r := runnable.NewUnmanaged(runnable.Options{})
	ctx, stop := context.WithCancel(context.Background())
	stop()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err == nil || !strings.Contains(err.Error(), "already started") {
		t.Fatalf("second Start = %v, want an 'already started' error", err)
	}

	r = runnable.NewUnmanaged(runnable.Options{})
	if err := r.Executor().Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "already drained") {
		t.Fatalf("Start after the drain = %v, want an 'already drained' error", err)
	}
	if r.Err() == nil {
		t.Fatal("Err after a failed Start = nil")
	}
}

func TestAddWithNilManager(t *testing.T) {
	q, err := runnable.Setup(&rest.Config{}, &ctrl.Options{}, runnable.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Add(nil); err == nil {
		t.Fatal("Add(nil) = nil error")
	}
}

// hangAll starts n calls on r's executor that return once release is closed, named
// "ctrl/ns/<i>/hang", one second apart (on synctest's clock): the first is the oldest.
func hangAll(t *testing.T, r *runnable.Runnable, n int, release <-chan struct{}) {
	t.Helper()
	for i := range n {
		if err := r.Executor().Go(context.Background(), fmt.Sprintf("ctrl/ns/%02d/hang", i), func(context.Context) error {
			<-release // ignores its context
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
}

func TestAbandonedCallsAreListedOnceAndBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.NewUnmanaged(runnable.Options{Logger: logs.logger(), CancelAfter: -1, ReportEvery: time.Hour, GracePeriod: 2 * time.Second})
		ctx, stop := context.WithCancel(context.Background())
		result := make(chan error, 1)
		go func() { result <- r.Start(ctx) }()
		release := make(chan struct{})
		hangAll(t, r, 25, release)
		stop()
		err := <-result

		// Outside the executor's reports, one line names calls: the abandoned line.
		var listing []string
		for _, l := range logs.all() {
			if strings.Contains(l, "ctrl/ns/") && !strings.Contains(l, `"msg"="Waiting for pending calls"`) {
				listing = append(listing, l)
			}
		}
		if len(listing) != 1 {
			t.Fatalf("%d lines name abandoned calls, want 1:\n%s", len(listing), strings.Join(listing, "\n"))
		}
		line := listing[0]
		for _, want := range []string{`"msg"="Abandoned calls still running after the grace period"`, `"abandoned"=25`, `"more"=5`,
			// The oldest first, aged since they started, up to the 20th.
			`"calls"=[{"name"="ctrl/ns/00/hang" "age"="27s" "detached"=true`, `"name"="ctrl/ns/19/hang" "age"="8s"`,
			// Where each waits, and the line of its own function (here the same).
			`"where"="runnable_test.hangAll.func1 (runnable_test.go:`, `"handler"="runnable_test.hangAll.func1 (runnable_test.go:`} {
			if !strings.Contains(line, want) {
				t.Errorf("abandoned line %s\nlacks %s", line, want)
			}
		}
		if got := strings.Count(line, `"name"=`); got != 20 {
			t.Errorf("abandoned line lists %d calls, want 20", got)
		}
		if strings.Contains(line, "ctrl/ns/20/hang") {
			t.Errorf("abandoned line lists the 21st call: %s", line)
		}

		// What controller-runtime and main log of the error does not list them again.
		if strings.Contains(err.Error(), "ctrl/ns/") || !strings.Contains(err.Error(), "25 call(s)") {
			t.Errorf("Start's error = %q, want the count and no names", err)
		}
		var pe *drain.PendingError
		if !errors.As(err, &pe) || len(pe.Pending) != 25 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Start = %v, want a *drain.PendingError of every call, and DeadlineExceeded", err)
		}
		close(release)
		if err := r.Executor().Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// The zero Logger is controller-runtime's (log.Log), named "quiesce", and so is a Logger whose
// sink is a typed nil; a typed-nil Clock is the real clock (quiesce's rule for plug-ins). The
// abandoned line goes to that logger, and the error counts the calls and wraps the
// *drain.PendingError.
func TestZeroAndTypedNilPlugins(t *testing.T) {
	for name, opts := range map[string]runnable.Options{
		"zero":      {},
		"typed nil": {Clock: (*clocktesting.FakeClock)(nil), Logger: nilsink.Logger()},
	} {
		synctest.Test(t, func(t *testing.T) {
			opts.CancelAfter, opts.GracePeriod = -1, time.Second
			r := runnable.NewUnmanaged(opts)
			before := len(crLog.all())
			ctx, stop := context.WithCancel(context.Background())
			result := make(chan error, 1)
			go func() { result <- r.Start(ctx) }()
			release := make(chan struct{})
			hangAll(t, r, 1, release)
			stop()
			var pe *drain.PendingError
			if err := <-result; !errors.As(err, &pe) || len(pe.Pending) != 1 {
				t.Errorf("%s: Start = %#v, want an error wrapping the *drain.PendingError of the call", name, err)
			}
			found := false
			for _, l := range crLog.all()[before:] {
				if strings.HasPrefix(l, "quiesce ") && strings.Contains(l, runnable.AbandonedMessage) &&
					strings.Contains(l, "ctrl/ns/00/hang") {
					found = true
				}
			}
			if !found {
				t.Errorf("%s: no abandoned line naming the call on controller-runtime's logger named quiesce", name)
			}
			close(release)
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Setup misuse: New panics on the Options that Add refuses with an error, naming the value.
func TestNewPanicsOnMisuse(t *testing.T) {
	for _, tc := range []struct {
		opts runnable.Options
		want string
	}{
		{runnable.Options{ShutdownDelay: -time.Second}, "runnable.New: ShutdownDelay is -1s"},
		{runnable.Options{CancelAfter: 30 * time.Second}, "runnable.New: CancelAfter (30s) must be below GracePeriod (25s)"},
		{runnable.Options{SlowAfter: time.Millisecond}, "runnable.New: SlowAfter is 1ms: set it to 0 (the default) or at least 1s"},
	} {
		v := func() (v any) {
			defer func() { v = recover() }()
			runnable.New(tc.opts)
			return nil
		}()
		if msg, _ := v.(string); !strings.HasPrefix(msg, tc.want) {
			t.Errorf("New(%+v) panicked with %#v, want %q", tc.opts, v, tc.want)
		}
	}
}

func TestShieldedFromCreation(t *testing.T) {
	// The executor of a Runnable is shielded from its creation (controller-runtime's
	// cancellation does not end a wrapped reconcile: the drain does); one of drain.New is not.
	synctest.Test(t, func(t *testing.T) {
		reconcileOnce := func(ex *drain.Executor) error {
			ctx, cancel := context.WithCancel(context.Background())
			wrapped := reconcilers.Wrap(ex, "cm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
				cancel() // controller-runtime's shutdown
				return reconcile.Result{}, ctx.Err()
			}), reconcilers.WrapOptions{})
			_, err := wrapped.Reconcile(ctx, reconcile.Request{})
			return err
		}
		if err := reconcileOnce(drain.New(drain.Options{})); !errors.Is(err, context.Canceled) {
			t.Errorf("a reconcile on an executor of drain.New saw %v, want its caller's cancellation", err)
		}
		r := runnable.NewUnmanaged(runnable.Options{CancelAfter: -1})
		if err := reconcileOnce(r.Executor()); err != nil {
			t.Errorf("a reconcile on a Runnable's executor saw its caller's cancellation: %v", err)
		}
		ctx, stop := context.WithCancel(context.Background())
		stop()
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A drain that had to cancel calls says so: the executor's line naming them, then a final line
// that is not "All calls returned" but counts the cancelled calls.
func TestStartSaysWhenCallsReturnedAfterBeingCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.NewUnmanaged(runnable.Options{Logger: logs.logger(), CancelAfter: time.Second, GracePeriod: 4 * time.Second})
		ctx, stop := context.WithCancel(context.Background())
		started := make(chan error, 1)
		go func() { started <- r.Start(ctx) }()
		synctest.Wait()
		if err := r.Executor().Go(context.Background(), "ctrl/ns/a", func(ctx context.Context) error {
			<-ctx.Done() // honours its context: returns once the drain cancels it
			return ctx.Err()
		}); err != nil {
			t.Fatal(err)
		}
		stop()
		if err := <-started; err != nil {
			t.Fatalf("Start = %v, want nil: the call returned within the grace period", err)
		}
		if got := r.Executor().Stats().Cancelled; got != 1 {
			t.Errorf("Stats().Cancelled = %d, want 1", got)
		}
		all := logs.all()
		got := messages(all)
		if len(got) == 0 || got[len(got)-1] != "All calls returned after being cancelled" {
			t.Fatalf("log messages = %q, want the last to be %q", got, "All calls returned after being cancelled")
		}
		if !slices.Contains(got, "Cancelling calls still running") {
			t.Errorf("log messages = %q, want the line naming the cancelled calls", got)
		}
		if last := all[len(all)-1]; !strings.Contains(last, `"cancelled"=1`) {
			t.Errorf("last line = %s, want cancelled=1", last)
		}
	})
}
