package runnable_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

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

func TestAddRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts runnable.Options
		mgr  ctrl.Options
		want string
	}{
		{"negative delay", runnable.Options{ShutdownDelay: -time.Second}, ctrl.Options{}, "ShutdownDelay is -1s"},
		{"no ManagerOptions", runnable.Options{}, ctrl.Options{}, "Options.ManagerOptions is nil: set it to the ctrl.Options"},
		{"grace at the default budget", runnable.Options{GracePeriod: 30 * time.Second}, ctrl.Options{},
			"raise GracefulShutdownTimeout in the manager's Options above 30s"},
		{"grace beyond the budget", runnable.Options{GracePeriod: 8 * time.Second},
			ctrl.Options{GracefulShutdownTimeout: ptr.To(4 * time.Second)}, "GracefulShutdownTimeout (4s"},
		{"CancelAfter beyond the grace", runnable.Options{CancelAfter: 30 * time.Second}, ctrl.Options{},
			"CancelAfter (30s) must be below GracePeriod (25s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mgr := newManager(t, &tc.mgr)
			tc.opts.ManagerOptions = &tc.mgr
			if tc.name == "no ManagerOptions" {
				tc.opts.ManagerOptions = nil
			}
			_, err := runnable.Add(mgr, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "failed to add quiesce runnable: ") {
				t.Fatalf("Add = %v, want an error with %q", err, tc.want)
			}
			// Nothing was added: a valid Add on the same manager works.
			if _, err := runnable.Add(mgr, runnable.Options{GracePeriod: time.Second, ManagerOptions: &tc.mgr}); err != nil {
				t.Fatalf("a valid Add after a refused one = %v", err)
			}
		})
	}
}

func TestSecondAddOnOneManagerFails(t *testing.T) {
	var opts ctrl.Options
	mgr := newManager(t, &opts)
	if _, err := runnable.Add(mgr, runnable.Options{ManagerOptions: &opts}); err != nil {
		t.Fatal(err)
	}
	if _, err := runnable.Add(mgr, runnable.Options{ManagerOptions: &opts}); err == nil || !strings.Contains(err.Error(), "once per manager") {
		t.Fatalf("second Add = %v, want a once-per-manager error", err)
	}
	// Another manager is another story.
	if _, err := runnable.Add(newManager(t, &opts), runnable.Options{ManagerOptions: &opts}); err != nil {
		t.Fatalf("Add on a second manager = %v", err)
	}
}

func TestAddSaysWhenDebugIsNotServed(t *testing.T) {
	var logs capture
	opts := ctrl.Options{}
	mgr := newManager(t, &opts) // metrics off
	if _, err := runnable.Add(mgr, runnable.Options{Logger: logs.logger(), ManagerOptions: &opts}); err != nil {
		t.Fatal(err)
	}
	got := messages(logs.all())
	if len(got) != 1 || got[0] != "Not serving /debug/quiesce: the manager's metrics server is off" ||
		!strings.Contains(logs.all()[0], "Metrics.BindAddress") {
		t.Fatalf("log = %q, want one line saying /debug/quiesce is not served and how to serve it", logs.all())
	}
}

func TestWebhookServerIsConnectedByAdd(t *testing.T) {
	ws := runnable.WebhookServer(webhook.NewServer(webhook.Options{Port: -1}))
	opts := ctrl.Options{WebhookServer: ws}
	if _, err := runnable.Add(newManager(t, &opts), runnable.Options{ManagerOptions: &opts}); err != nil {
		t.Fatal(err)
	}
	// One wrapper serves one manager's Runnable.
	other := newManager(t, &opts)
	if _, err := runnable.Add(other, runnable.Options{ManagerOptions: &opts}); err == nil ||
		!strings.Contains(err.Error(), "connected to another Runnable") {
		t.Fatalf("Add of a connected wrapper = %v, want an error", err)
	}
	// The failed Add claimed nothing: corrected, it works on the same manager.
	fixed := ctrl.Options{WebhookServer: runnable.WebhookServer(webhook.NewServer(webhook.Options{Port: -1}))}
	if _, err := runnable.Add(other, runnable.Options{ManagerOptions: &fixed}); err != nil {
		t.Fatalf("the corrected Add = %v", err)
	}
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
		case "Stop began":
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
	mgr := newManager(t, &opts)
	const delay = 300 * time.Millisecond
	var err error
	q, err = runnable.Add(mgr, runnable.Options{Logger: log,
		GracePeriod: 5 * time.Second, ShutdownDelay: delay, ManagerOptions: &opts})
	if err != nil {
		t.Fatal(err)
	}
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
	want := []string{"Not serving /debug/quiesce: the manager's metrics server is off", "Stop began", "Shutdown delay over",
		"Draining executor", "All calls returned"}
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
	opts := ctrl.Options{}
	mgr := newManager(t, &opts)
	if _, err := runnable.Add(mgr, runnable.Options{ShutdownDelay: time.Second, ManagerOptions: &opts}); err != nil {
		t.Fatal(err)
	}
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
