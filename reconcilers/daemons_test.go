package reconcilers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal/nilsink"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// daemonObject is an object as read from the API server: namespace "ns", a UID, generation 1.
func daemonObject(name string, uid types.UID) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid, Generation: 1}}
}

func keyOf(obj client.Object) client.ObjectKey { return client.ObjectKeyFromObject(obj) }

// drainedWithin drains ex at the end of a test, as drained does, but gives up after a
// minute (of the bubble's time), so that a daemon left running fails the test instead of
// hanging it.
func drainedWithin(t *testing.T, ex *drain.Executor) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Errorf("Drain: %v", err)
		}
	})
}

// untilStopped is a daemon that honours its context: it counts its starts and returns
// when its context ends.
func untilStopped(starts *atomic.Int32) func(context.Context) error {
	return func(ctx context.Context) error {
		starts.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
}

// messagesOf returns the lines of c whose message is msg.
func messagesOf(c *capture, msg string) []string {
	var out []string
	for _, l := range c.all() {
		if strings.Contains(l, `"msg"="`+msg+`"`) {
			out = append(out, l)
		}
	}
	return out
}

func TestDaemonsEnsureIsIdempotentAndNamesTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
		obj := daemonObject("a", "uid-a")
		var starts atomic.Int32
		for range 3 {
			if err := d.Ensure(context.Background(), obj, "heartbeat", untilStopped(&starts)); err != nil {
				t.Fatalf("Ensure: %v", err)
			}
		}
		synctest.Wait()
		if got := starts.Load(); got != 1 {
			t.Fatalf("daemon started %d times, want 1", got)
		}
		if got := names(ex.Pending()); len(got) != 1 || got[0] != "cm/ns/a/heartbeat" {
			t.Fatalf("Pending = %v, want [cm/ns/a/heartbeat]", got)
		}
		cluster := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "n", UID: "uid-n"}}
		if err := d.Ensure(context.Background(), cluster, "heartbeat", untilStopped(&starts)); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
		if got := names(ex.Pending()); len(got) != 2 || got[1] != "cm/n/heartbeat" {
			t.Fatalf("Pending = %v, want a cluster-scoped object named without namespace", got)
		}
		if s := d.Stats(); s.Running != 2 || s.Restarts != 0 {
			t.Fatalf("Stats = %+v, want 2 running, no restarts", s)
		}
		if stopped, err := d.Stop(context.Background(), keyOf(cluster), "heartbeat"); !stopped || err != nil {
			t.Fatalf("Stop = %v, %v", stopped, err)
		}
	})
}

func TestDaemonsEnsureOnARunningDaemonAllocatesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
		obj := daemonObject("a", "uid-a")
		var starts atomic.Int32
		fn := untilStopped(&starts)
		ctx := context.Background()
		if err := d.Ensure(ctx, obj, "heartbeat", fn); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			if err := d.Ensure(ctx, obj, "heartbeat", fn); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("Ensure on a running daemon allocates %v times, want 0", allocs)
		}
		synctest.Wait()
		if got := starts.Load(); got != 1 {
			t.Errorf("daemon started %d times, want 1", got)
		}
	})
}

func TestDaemonsRestartAfterACappedJitteredBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		var logs capture
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{
			Backoff: time.Second, MaxBackoff: 3 * time.Second, Logger: logs.logger(0),
		})
		var starts []time.Time
		fn := func(ctx context.Context) error {
			starts = append(starts, time.Now())
			switch len(starts) {
			case 1, 2, 4:
				return errors.New("poll failed")
			case 3:
				panic("boom")
			case 5: // a healthy run, longer than MaxBackoff, then a failure
				time.Sleep(10 * time.Second)
				return errors.New("poll failed")
			}
			<-ctx.Done()
			return nil
		}
		obj := daemonObject("a", "uid-a")
		if err := d.Ensure(context.Background(), obj, "poll", fn); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if len(starts) != 6 {
			t.Fatalf("daemon ran %d times, want 6", len(starts))
		}
		// The delay before each restart: doubled, capped at 3s, shortened by the jitter by up
		// to 10%; after the healthy run it starts again from Backoff.
		for i, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second, time.Second} {
			gap := starts[i+1].Sub(starts[i])
			if i == 4 {
				gap -= 10 * time.Second // the healthy run itself
			}
			if gap > want || gap < want-want/10 {
				t.Errorf("restart %d after %v, want %v less up to 10%%", i+1, gap, want)
			}
		}
		restarts := messagesOf(&logs, "Daemon failed, restarting after a backoff")
		if len(restarts) != 5 {
			t.Fatalf("logged %d restarts, want 5: %v", len(restarts), logs.all())
		}
		for _, want := range []string{`"controller"="cm"`, `"namespace"="ns"`, `"name"="a"`, `"daemon"="poll"`} {
			if !strings.Contains(restarts[0], want) {
				t.Errorf("restart line %s lacks %s", restarts[0], want)
			}
		}
		if !strings.Contains(restarts[2], `call \"cm/ns/a/poll\" panicked: boom`) {
			t.Errorf("the panic's restart line does not name the panic: %s", restarts[2])
		}
		if !strings.Contains(restarts[2], `"stack"=`) || strings.Contains(restarts[1], `"stack"=`) {
			t.Errorf("want a stack on the panic's restart line only: %s", restarts[1:3])
		}
		if s := d.Stats(); s.Restarts != 5 || s.Running != 1 {
			t.Errorf("Stats = %+v, want 5 restarts, 1 running", s)
		}
		if stopped, err := d.Stop(context.Background(), keyOf(obj), "poll"); !stopped || err != nil {
			t.Fatalf("Stop = %v, %v", stopped, err)
		}
	})
}

func TestDaemonsReturningNilIsDoneUntilANewGeneration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
		var runs atomic.Int32
		fn := func(ctx context.Context) error { runs.Add(1); return ctx.Err() }
		obj := daemonObject("a", "uid-a")
		ensure := func() {
			t.Helper()
			if err := d.Ensure(context.Background(), obj, "once", fn); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		ensure()
		ensure()
		if got := runs.Load(); got != 1 {
			t.Fatalf("ran %d times for generation 1, want 1", got)
		}
		if s := d.Stats(); s.Running != 0 || s.Restarts != 0 {
			t.Fatalf("Stats = %+v, want none running, no restarts", s)
		}
		obj.Generation = 2
		ensure()
		ensure()
		if got := runs.Load(); got != 2 {
			t.Fatalf("ran %d times after generation 2, want 2", got)
		}
		// Stop forgets it: the same generation runs again after a Stop.
		if stopped, err := d.Stop(context.Background(), keyOf(obj), "once"); !stopped || err != nil {
			t.Fatalf("Stop = %v, %v", stopped, err)
		}
		ensure()
		if got := runs.Load(); got != 3 {
			t.Fatalf("ran %d times after a Stop, want 3", got)
		}
	})
}

func TestDaemonsStopSignalsAndWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
		obj := daemonObject("a", "uid-a")
		cleanedUp := false
		fn := func(ctx context.Context) error {
			<-ctx.Done()
			time.Sleep(time.Second) // cleaning up after the signal, within the stop timeout
			cleanedUp = true
			return nil
		}
		if err := d.Ensure(context.Background(), obj, "heartbeat", fn); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		start := time.Now()
		stopped, err := d.Stop(context.Background(), keyOf(obj), "heartbeat")
		if !stopped || err != nil || !cleanedUp {
			t.Fatalf("Stop = %v, %v (cleaned up: %v), want true once it returned", stopped, err, cleanedUp)
		}
		if took := time.Since(start); took != time.Second {
			t.Errorf("Stop took %v, want the daemon's 1s", took)
		}
		if d.Stats().Running != 0 {
			t.Errorf("after Stop: %+v", d.Stats())
		}
		synctest.Wait() // the executor unlists the call once fn's goroutine returned
		if len(ex.Pending()) != 0 {
			t.Errorf("after Stop: pending %v", names(ex.Pending()))
		}
		// Idempotent, and true for a daemon that never ran.
		for _, k := range []client.ObjectKey{keyOf(obj), {Namespace: "ns", Name: "never"}} {
			if stopped, err := d.Stop(context.Background(), k, "heartbeat"); !stopped || err != nil {
				t.Errorf("Stop(%v) = %v, %v, want true", k, stopped, err)
			}
		}
	})
}

// releaser returns a channel for daemons to block on, closed by release or, should the test
// fail first, by its cleanup (before the drain that waits for them).
func releaser(t *testing.T) (ch chan struct{}, release func()) {
	ch = make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return ch, release
}

// blocking is a daemon that ignores its context until release is closed.
func blocking(starts *atomic.Int32, release <-chan struct{}) func(context.Context) error {
	return func(context.Context) error {
		starts.Add(1)
		<-release
		return nil
	}
}

// The zero Logger is controller-runtime's (log.Log), as in runnable.Options: a daemon's fn
// logs there, with the daemon's keys.
func TestDaemonsZeroLoggerIsControllerRuntimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		before := len(messagesOf(&crLog, "Daemon beat")) // crLog is the process's: -count=N
		d := reconcilers.NewDaemons(ex, "zero-logger", reconcilers.DaemonsOptions{})
		if err := d.Ensure(context.Background(), daemonObject("a", "uid-a"), "heartbeat", func(ctx context.Context) error {
			log.FromContext(ctx).Info("Daemon beat")
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		lines := messagesOf(&crLog, "Daemon beat")[before:]
		if len(lines) != 1 || !strings.Contains(lines[0], `"controller"="zero-logger"`) ||
			!strings.Contains(lines[0], `"daemon"="heartbeat"`) {
			t.Errorf("controller-runtime's logger has %q, want the daemon's line with its keys", lines)
		}
	})
}

// A typed-nil Clock or logger sink is nil (quiesce's rule for plug-ins): the real clock and
// controller-runtime's logger, not a nil dereference when a daemon fails.
func TestDaemonsTypedNilPlugins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "typed-nil", reconcilers.DaemonsOptions{
			Clock: (*clocktesting.FakeClock)(nil), Logger: nilsink.Logger(),
		})
		var starts atomic.Int32
		if err := d.Ensure(context.Background(), daemonObject("a", "uid-a"), "flaky", func(ctx context.Context) error {
			if starts.Add(1) == 1 {
				return errors.New("first attempt fails")
			}
			<-ctx.Done()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute) // past the restart's backoff, on the bubble's clock
		synctest.Wait()
		if n := starts.Load(); n != 2 {
			t.Errorf("the daemon started %d times, want 2: restarted on the real clock", n)
		}
		if lines := messagesOf(&crLog, "Daemon failed, restarting after a backoff"); len(lines) == 0 ||
			!strings.Contains(lines[len(lines)-1], `"controller"="typed-nil"`) {
			t.Errorf("the restart is not on controller-runtime's logger: %q", lines)
		}
	})
}

func TestDaemonsStopTimeout(t *testing.T) {
	for _, tc := range []struct {
		name        string
		stopTimeout time.Duration
		want        time.Duration
	}{
		{"set", 2 * time.Second, 2 * time.Second},
		{"zero means the default", 0, reconcilers.DefaultDaemonStopTimeout},
		{"negative only signals", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ex := drain.New(drain.Options{})
				drainedWithin(t, ex)
				var logs capture
				d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{StopTimeout: tc.stopTimeout, Logger: logs.logger(0)})
				obj := daemonObject("a", "uid-a")
				release, releaseNow := releaser(t)
				var starts atomic.Int32
				if err := d.Ensure(context.Background(), obj, "stuck", blocking(&starts, release)); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				start := time.Now()
				stopped, err := d.Stop(context.Background(), keyOf(obj), "stuck")
				if stopped || err != nil {
					t.Fatalf("Stop = %v, %v, want false, nil for a daemon that blocks its stop", stopped, err)
				}
				if took := time.Since(start); took != tc.want {
					t.Errorf("Stop gave up after %v, want %v", took, tc.want)
				}
				if got := len(messagesOf(&logs, "Daemon did not stop within the stop timeout")); got != min(int(tc.want), 1) {
					t.Errorf("logged the timeout %d times: %v", got, logs.all())
				}
				// Still tracked and named; an Ensure meanwhile does not start a second one.
				if got := names(ex.Pending()); len(got) != 1 || got[0] != "cm/ns/a/stuck" {
					t.Errorf("Pending = %v", got)
				}
				// A Stop whose ctx ends first returns its error.
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if stopped, err := d.Stop(ctx, keyOf(obj), "stuck"); stopped || !errors.Is(err, context.Canceled) {
					if tc.stopTimeout >= 0 {
						t.Errorf("Stop with an ended ctx = %v, %v, want false, context.Canceled", stopped, err)
					}
				}
				releaseNow()
				synctest.Wait()
				if stopped, err := d.Stop(context.Background(), keyOf(obj), "stuck"); !stopped || err != nil {
					t.Errorf("Stop once it returned = %v, %v", stopped, err)
				}
				if got := starts.Load(); got != 1 {
					t.Errorf("started %d times, want 1", got)
				}
			})
		})
	}
}

func TestDaemonsStopWhenTheDrainBegins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		// CancelAfter never: daemons are signalled when the drain begins all the same.
		ex := drain.New(drain.Options{CancelAfter: -1, Logger: logs.logger(0)})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{Backoff: time.Second})
		var starts atomic.Int32
		for _, name := range []string{"a", "b", "c"} {
			if err := d.Ensure(context.Background(), daemonObject(name, types.UID("uid-"+name)), "heartbeat", untilStopped(&starts)); err != nil {
				t.Fatal(err)
			}
		}
		// One in its restart backoff when the drain begins: it is not restarted.
		var failing atomic.Int32
		if err := d.Ensure(context.Background(), daemonObject("d", "uid-d"), "poll", func(context.Context) error {
			failing.Add(1)
			return errors.New("poll failed")
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Fatalf("Drain: %v", err)
		}
		if took := time.Since(start); took != 0 {
			t.Errorf("Drain took %v, want 0: the daemons' contexts end when it begins", took)
		}
		if logs.all() != nil {
			t.Errorf("the drain logged %v, want nothing: every daemon returned", logs.all())
		}
		time.Sleep(time.Hour)
		if got := failing.Load(); got != 1 {
			t.Errorf("the failing daemon ran %d times, want 1: no restart during a drain", got)
		}
		if s := d.Stats(); s.Running != 0 {
			t.Errorf("Stats = %+v, want none running", s)
		}

		// Ensure after the drain began is refused, and Wrap requeues the reconcile quietly.
		err := d.Ensure(context.Background(), daemonObject("e", "uid-e"), "heartbeat", untilStopped(&starts))
		if !errors.Is(err, drain.ErrDraining) {
			t.Fatalf("Ensure after the drain began = %v, want ErrDraining", err)
		}
		r := reconcilers.Wrap(drain.New(drain.Options{}), "cm", reconcile.Func(
			func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
				return reconcile.Result{}, d.Ensure(ctx, daemonObject(req.Name, "uid-e"), "heartbeat", untilStopped(&starts))
			}), reconcilers.WrapOptions{})
		res, err := r.Reconcile(context.Background(), request("ns", "e"))
		if err != nil || res.RequeueAfter != reconcilers.DefaultRequeueAfter {
			t.Errorf("wrapped reconcile = %+v, %v, want a quiet requeue", res, err)
		}
		if got := starts.Load(); got != 3 {
			t.Errorf("started %d daemons, want 3", got)
		}
	})
}

func TestDaemonsDrainNamesTheOneIgnoringItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
		var starts atomic.Int32
		if err := d.Ensure(context.Background(), daemonObject("a", "uid-a"), "heartbeat", untilStopped(&starts)); err != nil {
			t.Fatal(err)
		}
		release, releaseNow := releaser(t)
		if err := d.Ensure(context.Background(), daemonObject("stuck", "uid-s"), "heartbeat", blocking(&starts, release)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := ex.Drain(ctx)
		var pe *drain.PendingError
		if !errors.As(err, &pe) || len(pe.Pending) != 1 || pe.Pending[0].Name != "cm/ns/stuck/heartbeat" {
			t.Fatalf("Drain = %v, want a PendingError naming only cm/ns/stuck/heartbeat", err)
		}
		releaseNow()
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatalf("Drain once released: %v", err)
		}
	})
}

func TestDaemonsRecreatedObjectWaitsForTheOldDaemon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{StopTimeout: time.Second})
		old := daemonObject("a", "uid-old")
		var oldSignalled atomic.Bool
		release, releaseNow := releaser(t)
		if err := d.Ensure(context.Background(), old, "heartbeat", func(ctx context.Context) error {
			<-ctx.Done()
			oldSignalled.Store(true)
			<-release // slow to stop
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		// The object was deleted and recreated under the same name before any reconcile saw
		// the deletion: the Ensure for the new UID signals the old daemon, and the new one
		// waits for it.
		var newStarts atomic.Int32
		recreated := daemonObject("a", "uid-new")
		for range 2 {
			if err := d.Ensure(context.Background(), recreated, "heartbeat", untilStopped(&newStarts)); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if !oldSignalled.Load() {
			t.Fatal("the old daemon was not signalled")
		}
		if got := newStarts.Load(); got != 0 {
			t.Fatalf("the new daemon started while the old one still stops")
		}
		if got := names(ex.Pending()); len(got) != 2 {
			t.Errorf("Pending = %v, want the old and the waiting new daemon", got)
		}
		// A Stop meanwhile covers both.
		if stopped, _ := d.Stop(context.Background(), keyOf(recreated), "heartbeat"); stopped {
			t.Error("Stop = true while the old daemon still runs")
		}
		releaseNow()
		synctest.Wait()
		if got := newStarts.Load(); got != 0 {
			t.Errorf("the new daemon ran %d times after it was stopped, want 0", got)
		}
		if len(ex.Pending()) != 0 {
			t.Errorf("Pending = %v, want none", names(ex.Pending()))
		}

		// Without a Stop, the new one starts once the old one returned.
		release2, releaseNow2 := releaser(t)
		if err := d.Ensure(context.Background(), old, "heartbeat", func(ctx context.Context) error {
			<-ctx.Done()
			<-release2
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := d.Ensure(context.Background(), recreated, "heartbeat", untilStopped(&newStarts)); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := newStarts.Load(); got != 0 {
			t.Fatalf("the new daemon started while the old one still stops")
		}
		releaseNow2()
		synctest.Wait()
		if got := newStarts.Load(); got != 1 {
			t.Fatalf("the new daemon started %d times once the old one returned, want 1", got)
		}
		if stopped, err := d.Stop(context.Background(), keyOf(recreated), "heartbeat"); !stopped || err != nil {
			t.Fatalf("Stop = %v, %v", stopped, err)
		}
	})
}

func TestDaemonsDaemonContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ex := drain.New(drain.Options{})
		drainedWithin(t, ex)
		var logs capture
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{Logger: logs.logger(0)})
		obj := daemonObject("a", "uid-a")
		var inner []string
		// The reconcile's context ends once it returned; the daemon's does not.
		rctx, cancel := context.WithCancel(context.Background())
		if err := d.Ensure(rctx, obj, "heartbeat", func(ctx context.Context) error {
			log.FromContext(ctx).Info("Beat")
			err := reconcilers.Call(ctx, "write", func(context.Context) error {
				inner = names(ex.Pending())
				return nil
			})
			<-ctx.Done()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		cancel()
		synctest.Wait()
		if len(inner) != 2 || inner[1] != "cm/ns/a/heartbeat/write" {
			t.Errorf("a Call inside the daemon is named %v, want cm/ns/a/heartbeat/write", inner)
		}
		if len(ex.Pending()) != 1 {
			t.Errorf("the daemon ended with the ensuring reconcile's context")
		}
		beat := messagesOf(&logs, "Beat")
		if len(beat) != 1 || !strings.Contains(beat[0], `"daemon"="heartbeat"`) {
			t.Errorf("the daemon's logger: %v", logs.all())
		}
		// An ended reconcile context starts nothing.
		var starts atomic.Int32
		if err := d.Ensure(rctx, daemonObject("b", "uid-b"), "heartbeat", untilStopped(&starts)); !errors.Is(err, context.Canceled) {
			t.Errorf("Ensure with an ended ctx = %v, want context.Canceled", err)
		}
		if _, err := d.Stop(context.Background(), keyOf(obj), "heartbeat"); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDaemonsBadInput(t *testing.T) {
	ex := drain.New(drain.Options{})
	drainedWithin(t, ex)
	d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
	ctx := context.Background()
	fn := func(context.Context) error { return nil }
	huge := strings.Repeat("n", 10_000)
	for name, err := range map[string]error{
		"empty name":   d.Ensure(ctx, daemonObject("a", "uid"), "", fn),
		"nil fn":       d.Ensure(ctx, daemonObject("a", "uid"), "d", nil),
		"nil object":   d.Ensure(ctx, nil, "d", fn),
		"typed nil":    d.Ensure(ctx, (*corev1.ConfigMap)(nil), "d", fn),
		"no UID":       d.Ensure(ctx, daemonObject("a", ""), "d", fn),
		"stop no name": func() error { _, err := d.Stop(ctx, client.ObjectKey{Name: "a"}, ""); return err }(),
		// Names of 10,000 bytes: the error is bounded like the names in it (cut at 256 bytes).
		"huge name, nil fn": d.Ensure(ctx, daemonObject("a", "uid"), huge, nil),
		"huge names, no UID": d.Ensure(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: huge, Name: huge}},
			huge, fn),
	} {
		if !errors.Is(err, drain.ErrInvalidCall) {
			t.Errorf("%s: err = %v, want ErrInvalidCall", name, err)
		}
		if n := len(err.Error()); n > 1024 {
			t.Errorf("%s: an error of %d bytes, want at most 1 KiB", name, n)
		}
	}
	if len(ex.Pending()) != 0 || d.Stats().Running != 0 {
		t.Errorf("bad input started something: %v", names(ex.Pending()))
	}
	for name, setup := range map[string]func(){
		"no executor":        func() { reconcilers.NewDaemons(nil, "cm", reconcilers.DaemonsOptions{}) },
		"no controller name": func() { reconcilers.NewDaemons(ex, "", reconcilers.DaemonsOptions{}) },
	} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(v.(string), "reconcilers.NewDaemons") {
					t.Errorf("%s: recovered %v, want a clear panic", name, v)
				}
			}()
			setup()
		}()
	}
}

func TestDaemonsAreListedAsDaemonsAndNeverSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		ex := drain.New(drain.Options{Logger: logs.logger(0), SlowAfter: time.Second, ReportEvery: time.Second})
		drainedWithin(t, ex)
		d := reconcilers.NewDaemons(ex, "cm", reconcilers.DaemonsOptions{})
		var starts atomic.Int32
		if err := d.Ensure(context.Background(), daemonObject("a", "uid-a"), "heartbeat", untilStopped(&starts)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		ps := ex.Pending()
		if len(ps) != 1 || !ps[0].Daemon {
			t.Fatalf("Pending = %+v, want one daemon", ps)
		}
		if s := ex.Stats(); s.Slow != 0 || !s.Oldest.IsZero() || s.InFlight != 1 {
			t.Errorf("Stats = %+v, want 1 in flight, none slow, no oldest", s)
		}
		if lines := logs.all(); len(lines) != 0 {
			t.Errorf("logged %v, want nothing: a daemon is never slow", lines)
		}
	})
}
