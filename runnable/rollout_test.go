package runnable_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/runnable"
)

// noAPIServer is the host of a manager that never reaches an API server.
const noAPIServer = "http://127.0.0.1:1"

// newManager makes a real manager that needs no API server as long as nothing reads
// through its cache, with no listeners.
func newManager(t *testing.T, opts *ctrl.Options) ctrl.Manager {
	t.Helper()
	opts.Metrics = metricsserver.Options{BindAddress: "0"}
	opts.HealthProbeBindAddress = "0"
	mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, *opts)
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

// StopContext delays the manager's stop: everything keeps serving for the delay, while
// readiness fails; then the manager stops and the drain begins.
func TestRealManagerKeepsServingForTheDelay(t *testing.T) {
	var logs capture
	var q *runnable.Runnable
	var readyAtStop error
	drainingAtDelayEnd := true
	delayOver := make(chan struct{})
	log := logs.logger()
	log = logr.New(&hookSink{LogSink: log.GetSink(), hook: func(msg string) {
		switch msg {
		case stopBegan:
			readyAtStop = q.ReadyzCheck(nil)
		case "Shutdown delay over":
			select {
			case <-q.Executor().Draining():
			default:
				drainingAtDelayEnd = false
			}
			close(delayOver)
		}
	}})
	opts := ctrl.Options{GracefulShutdownTimeout: ptr.To(10 * time.Second)}
	const delay = 300 * time.Millisecond
	mgr, q := setupManager(t, &opts, runnable.Options{Logger: log, GracePeriod: 5 * time.Second, ShutdownDelay: delay})
	// A call in flight through the delay: it must not be refused or cancelled.
	if err := q.Executor().Go(context.Background(), "job", func(ctx context.Context) error {
		<-delayOver
		return ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	stop()
	begin := time.Now()
	if err := mgr.Start(q.StopContext(ctx)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < delay {
		t.Errorf("mgr.Start returned %v after the stop, before the %v delay", took, delay)
	}
	if readyAtStop == nil {
		t.Error("ReadyzCheck passed when the stop began")
	}
	if drainingAtDelayEnd {
		t.Error("the executor drained before the delay was over")
	}
	want := []string{stopBegan, "Shutdown delay over", "Draining executor", "All calls returned"}
	if got := messages(logs.all()); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("log messages = %q, want %q", got, want)
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
}

// With a ShutdownDelay and a manager started on another context than StopContext's, the
// manager does not start: the delay could not keep every controller serving.
func TestRealManagerRefusesADelayWithoutStopContext(t *testing.T) {
	mgr, _ := setupManager(t, &ctrl.Options{}, runnable.Options{ShutdownDelay: time.Second})
	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	if err := mgr.Start(ctx); err == nil || !strings.Contains(err.Error(), "StopContext") {
		t.Fatalf("mgr.Start = %v, want the StopContext error", err)
	}
}

// hookSink calls hook with each message before logging it.
type hookSink struct {
	logr.LogSink
	hook func(msg string)
}

func (s *hookSink) Info(level int, msg string, kv ...any) {
	s.hook(msg)
	s.LogSink.Info(level, msg, kv...)
}

func (s *hookSink) WithValues(kv ...any) logr.LogSink {
	return &hookSink{LogSink: s.LogSink.WithValues(kv...), hook: s.hook}
}

func (s *hookSink) WithName(name string) logr.LogSink {
	return &hookSink{LogSink: s.LogSink.WithName(name), hook: s.hook}
}

// An Add that fails at its last fallible step (DebugPath taken on the metrics server)
// leaves the manager as it was: the same error again, not "has one already", and the
// manager starts and stops without quiesce.
func TestFailedAddLeavesTheManagerAsItWas(t *testing.T) {
	var logs capture
	opts := ctrl.Options{HealthProbeBindAddress: "0", Logger: logs.logger(),
		Metrics: metricsserver.Options{BindAddress: "127.0.0.1:0", FilterProvider: noFilter}}
	q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &opts, runnable.Options{ShutdownDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.AddMetricsServerExtraHandler(runnable.DebugPath, http.NotFoundHandler()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := q.Add(mgr); err == nil || !strings.Contains(err.Error(), "failed to add quiesce debug handler at /debug/quiesce") {
			t.Fatalf("Add = %v, want the debug handler's error", err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stop()
	if err := <-done; err != nil {
		t.Fatalf("mgr.Start after a failed Add = %v, want nil", err)
	}
	for _, l := range logs.all() {
		if strings.Contains(l, "quiesce") {
			t.Errorf("the manager logged %s after a failed Add", l)
		}
	}
}

// noFilter is a metrics FilterProvider that lets every request through: in a real
// operator, filters.WithAuthenticationAndAuthorization.
func noFilter(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	return func(_ logr.Logger, h http.Handler) (http.Handler, error) { return h, nil }, nil
}
