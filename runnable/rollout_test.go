package runnable_test

import (
	"context"
	"net/http"
	"slices"
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

// With the metrics server off (the user's choice), Add says at V(1) that /debug/quiesce is not served.
func TestAddSaysWhenDebugIsNotServed(t *testing.T) {
	var logs capture
	opts := ctrl.Options{}
	mgr := newManager(t, &opts) // metrics off
	if _, err := runnable.Add(mgr, runnable.Options{Logger: logs.loggerV(1), ManagerOptions: &opts}); err != nil {
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

// With leader election on, Add refuses a manager whose lease quiesce does not observe,
// and takes one that ObserveLease prepared.
func TestAddNeedsTheLeaseObserved(t *testing.T) {
	cfg := &rest.Config{Host: noAPIServer}
	opts := ctrl.Options{LeaderElection: true, LeaderElectionID: "x.example.com", LeaderElectionNamespace: "ns",
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runnable.Add(mgr, runnable.Options{ManagerOptions: &opts}); err == nil ||
		!strings.Contains(err.Error(), "call runnable.ObserveLease(cfg, &mgrOpts) before ctrl.NewManager") {
		t.Fatalf("Add with an unobserved lease = %v, want an error naming ObserveLease", err)
	}
	if err := runnable.ObserveLease(cfg, &opts); err != nil {
		t.Fatal(err)
	}
	mgr, err = ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runnable.Add(mgr, runnable.Options{ManagerOptions: &opts}); err != nil {
		t.Fatalf("Add with the lease observed = %v", err)
	}
	// One observer serves one manager's Runnable.
	other, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runnable.Add(other, runnable.Options{ManagerOptions: &opts}); err == nil ||
		!strings.Contains(err.Error(), "connected to another Runnable") {
		t.Fatalf("Add with another manager's observer = %v, want an error", err)
	}
}

// An Add that fails at its last fallible step (DebugPath taken on the metrics server)
// leaves the manager as it was: the same error again, not "has one already", and the
// manager starts and stops without quiesce.
func TestFailedAddLeavesTheManagerAsItWas(t *testing.T) {
	var logs capture
	opts := ctrl.Options{HealthProbeBindAddress: "0", Logger: logs.logger(),
		Metrics: metricsserver.Options{BindAddress: "127.0.0.1:0", FilterProvider: noFilter}}
	mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.AddMetricsServerExtraHandler(runnable.DebugPath, http.NotFoundHandler()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := runnable.Add(mgr, runnable.Options{ManagerOptions: &opts, ShutdownDelay: time.Second}); err == nil ||
			!strings.Contains(err.Error(), "failed to add quiesce debug handler at /debug/quiesce") {
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

// /debug/quiesce is served only behind the metrics server's filter, unless the user opts in.
func TestDebugServedOnlyBehindAFilter(t *testing.T) {
	for _, tc := range []struct {
		name     string
		filter   func(*rest.Config, *http.Client) (metricsserver.Filter, error)
		insecure bool
		served   bool
	}{
		{"no filter", nil, false, false},
		{"no filter, opted in", nil, true, true},
		{"filter", noFilter, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs capture
			opts := ctrl.Options{HealthProbeBindAddress: "0",
				Metrics: metricsserver.Options{BindAddress: "127.0.0.1:0", FilterProvider: tc.filter}}
			mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := runnable.Add(mgr, runnable.Options{ManagerOptions: &opts, Logger: logs.loggerV(1),
				DebugWithoutFilter: tc.insecure}); err != nil {
				t.Fatal(err)
			}
			// The path is free only if Add did not take it.
			free := mgr.AddMetricsServerExtraHandler(runnable.DebugPath, http.NotFoundHandler()) == nil
			if free == tc.served {
				t.Errorf("DebugPath served = %t, want %t", !free, tc.served)
			}
			said := slices.Contains(messages(logs.all()), "Not serving /debug/quiesce: the metrics server authenticates no one")
			if said == tc.served {
				t.Errorf("logged that DebugPath is not served: %t, want %t (log %q)", said, !tc.served, logs.all())
			}
		})
	}
}
