package runnable

import (
	"context"
	"net/http"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
)

// stubManager is the part of a manager that Runnable.Add uses; it keeps nothing.
type stubManager struct {
	manager.Manager // nil: calling anything else panics
	events          record.EventRecorder
}

func (m stubManager) GetEventRecorderFor(string) record.EventRecorder { return m.events }
func (stubManager) Elected() <-chan struct{}                          { return nil }

// addedRunnable is a Runnable of Setup, added to a stubManager.
func addedRunnable(t *testing.T, opts Options) *Runnable {
	t.Helper()
	r, err := Setup(&rest.Config{}, &manager.Options{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Add(stubManager{}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (stubManager) Add(manager.Runnable) error                              { return nil }
func (stubManager) AddReadyzCheck(string, healthz.Checker) error            { return nil }
func (stubManager) AddMetricsServerExtraHandler(string, http.Handler) error { return nil }
func (stubManager) GetLogger() logr.Logger                                  { return logr.Discard() }

// collect returns the value of each metric of c without labels, by name.
func collect(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			out[f.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return out
}

// heapAlloc returns the bytes of live heap objects, after a full collection.
func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The metrics keep the counters of a stopped Runnable, not its executor: adding and stopping
// many Runnables leaves the collector and the heap as they were, and the counters monotonic.
func TestStoppedRunnablesAreFoldedAndReleased(t *testing.T) {
	const runnables, callsEach = 1000, 3
	// Other tests (or an earlier -count run) may leave Runnables tracked, never started:
	// count from what is tracked now.
	before := stats.tracked()
	stopped, stop := context.WithCancel(context.Background())
	stop()
	nop := func(context.Context) error { return nil }
	last := collect(t, stats)
	check := func() {
		t.Helper()
		now := collect(t, stats)
		for _, name := range []string{"quiesce_calls_started_total", "quiesce_calls_refused_total",
			"quiesce_calls_panicked_total", "quiesce_calls_abandoned_total"} {
			if now[name] < last[name] {
				t.Fatalf("%s went down from %v to %v", name, last[name], now[name])
			}
		}
		last = now
	}
	// Half of the Runnables stop as usual; the others find their executor drained
	// already, and refuse a call first.
	run := func(i int) {
		r := addedRunnable(t, Options{Logger: logr.New(log.NullLogSink{})})
		for range callsEach {
			if err := r.Executor().Call(context.Background(), "call", nop); err != nil {
				t.Fatal(err)
			}
		}
		check() // r counts, live
		if i%2 == 0 {
			if err := r.Start(stopped); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := r.Executor().Call(context.Background(), "late", nop); err == nil {
				t.Fatal("a drained executor ran a call")
			}
			if err := r.Start(stopped); err == nil {
				t.Fatal("Start of a drained executor = nil")
			}
		}
		check() // r counts, folded
	}

	run(0) // warm up: first-use allocations are not growth
	run(1)
	base, started, refused := heapAlloc(), last["quiesce_calls_started_total"], last["quiesce_calls_refused_total"]
	for i := range runnables {
		run(i)
	}
	grown := int64(heapAlloc()) - int64(base)
	t.Logf("heap grew by %d bytes over %d Runnables", grown, runnables)

	if n := stats.tracked(); n != before {
		t.Errorf("%d Runnables still tracked after they stopped, want the %d tracked before", n, before)
	}
	if got, want := last["quiesce_calls_started_total"]-started, float64(runnables*callsEach); got != want {
		t.Errorf("quiesce_calls_started_total grew by %v, want %v", got, want)
	}
	if got, want := last["quiesce_calls_refused_total"]-refused, float64(runnables/2); got != want {
		t.Errorf("quiesce_calls_refused_total grew by %v, want %v", got, want)
	}
	// A drained executor kept reachable costs about 1 KiB: 1,000 of them, about 1 MiB.
	// Runs without the fold measure below 50 KiB, one-time allocations included.
	if grown > 256<<10 {
		t.Errorf("heap grew by %d bytes over %d stopped Runnables, want < 256 KiB", grown, runnables)
	}
}

func TestOldestCallAgeAndSlowCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := &statsCollector{live: make(map[*Runnable]struct{})}
		byDefault := New(Options{}).r // SlowAfter: 1m
		quick := New(Options{SlowAfter: 10 * time.Second}).r
		never := New(Options{SlowAfter: -1}).r
		for _, r := range []*Runnable{byDefault, quick, never} {
			c.track(r)
		}
		want := func(oldest time.Duration, slow int) {
			t.Helper()
			got := collect(t, c)
			if got["quiesce_oldest_call_age_seconds"] != oldest.Seconds() || got["quiesce_calls_slow"] != float64(slow) {
				t.Fatalf("oldest call age %vs, slow calls %v; want %vs and %d", got["quiesce_oldest_call_age_seconds"],
					got["quiesce_calls_slow"], oldest.Seconds(), slow)
			}
		}
		want(0, 0)

		release := make(chan struct{})
		hang := func(r *Runnable, name string) {
			t.Helper()
			if err := r.Executor().Go(context.Background(), name, func(context.Context) error {
				<-release
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		hang(never, "never-slow") // at 0s
		time.Sleep(30 * time.Second)
		hang(byDefault, "default-a") // at 30s
		hang(quick, "quick-a")
		time.Sleep(50 * time.Second)
		hang(quick, "quick-b") // at 80s
		time.Sleep(15 * time.Second)
		hang(quick, "quick-c") // at 95s
		hang(byDefault, "default-b")
		// At 95s: never-slow 95s (never counted), default-a 65s > 1m, quick-a 65s and
		// quick-b 15s > 10s; quick-c and default-b 0s.
		want(95*time.Second, 3)
		time.Sleep(5 * time.Second)
		want(100*time.Second, 3)

		close(release)
		for _, r := range []*Runnable{byDefault, quick, never} {
			if err := r.Executor().Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		want(0, 0)
	})
}

// histogramCount returns how many durations quiesce_call_duration_seconds observed for
// controller.
func histogramCount(t *testing.T, controller string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := callSeconds.WithLabelValues(controller).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestCallDurationByController(t *testing.T) {
	r := addedRunnable(t, Options{})
	wrapped := reconcilers.Wrap(r.Executor(), "memcached", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, reconcilers.Call(ctx, "backup", func(context.Context) error { return nil })
	}), reconcilers.WrapOptions{})
	memcached, other := histogramCount(t, "memcached"), histogramCount(t, otherCalls)
	if _, err := wrapped.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	// Calls outside a wrapped reconciler count under one value, whatever their name.
	for _, name := range []string{"job", "memcached/ns/a"} {
		if err := r.Executor().Call(context.Background(), name, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if got := histogramCount(t, "memcached") - memcached; got != 2 {
		t.Errorf(`controller="memcached" observed %d calls, want 2: the reconcile and its handler call`, got)
	}
	if got := histogramCount(t, otherCalls) - other; got != 2 {
		t.Errorf(`controller=%q observed %d calls, want 2: the calls outside a wrapped reconciler`, otherCalls, got)
	}
	stopped, stop := context.WithCancel(context.Background())
	stop()
	if err := r.Start(stopped); err != nil {
		t.Fatal(err)
	}
}

// A call the drain cancels while it runs is counted in quiesce_calls_cancelled_total.
func TestCancelledCallsCounted(t *testing.T) {
	before := collect(t, stats)["quiesce_calls_cancelled_total"]
	r := addedRunnable(t, Options{Logger: logr.New(log.NullLogSink{}), CancelAfter: time.Nanosecond})
	running := make(chan struct{})
	if err := r.Executor().Go(context.Background(), "waits", func(ctx context.Context) error {
		close(running)
		<-ctx.Done()
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	<-running
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Executor().Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, stats)["quiesce_calls_cancelled_total"] - before; got != 1 {
		t.Fatalf("quiesce_calls_cancelled_total rose by %v, want 1", got)
	}
	stats.fold(r)
}

// tracked is how many Runnables c holds.
func (c *statsCollector) tracked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

// otherCalls is the controller label of calls outside a wrapped reconciler: no controller's
// name, and to Prometheus the label's absence.
const otherCalls = ""
