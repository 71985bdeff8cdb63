package runnable_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/runnable"
)

// Set quiesce up in main.go: Setup on the manager's Options, Add once the manager exists,
// and start the manager on StopContext; wrap reconcilers with its executor. After mgr.Start
// returned, Err says whether calls had to be abandoned.
func ExampleSetup() {
	// In an operator: ctrl.GetConfigOrDie() and your usual options.
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	mgrOpts := ctrl.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	}
	q, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{
		GracePeriod: 25 * time.Second, // below GracefulShutdownTimeout
		CancelAfter: 20 * time.Second, // let reconciles finish
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := q.Add(mgr); err != nil {
		fmt.Println(err)
		return
	}
	// ...Complete(reconcilers.Wrap(q.Executor(), "memcached", r, reconcilers.WrapOptions{}))

	ctx, stop := context.WithCancel(context.Background()) // ctrl.SetupSignalHandler()
	stop()                                                // as if SIGTERM came at once
	if err := mgr.Start(q.StopContext(ctx)); err != nil {
		fmt.Println(err)
	}
	fmt.Println("abandoned calls:", q.Err() != nil)
	// Output: abandoned calls: false
}

// ServeHTTP lists the pending calls, oldest first; Add serves it at /debug/quiesce on the
// manager's metrics server (curl it where you scrape /metrics).
func ExampleRunnable_ServeHTTP() {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mgrOpts := ctrl.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}
	q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mgrOpts, runnable.Options{Clock: clk})
	if err != nil {
		fmt.Println(err)
		return
	}
	release := make(chan struct{})
	_ = q.Executor().Go(context.Background(), "backup", func(context.Context) error {
		<-release // a call that takes a while
		return nil
	})
	clk.Step(3 * time.Second)

	rec := httptest.NewRecorder()
	q.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/quiesce?limit=10", nil))
	var body struct {
		Draining bool
		Count    int
		Calls    []struct {
			Name, Age, Where, Handler string
			Detached                  bool
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		fmt.Println(err)
	}
	fmt.Println(rec.Code, "draining:", body.Draining, "count:", body.Count)
	for _, c := range body.Calls {
		fmt.Println(c.Name, c.Age, "detached:", c.Detached) // Where, Handler: the lines it waits on
	}

	close(release)
	_ = q.Executor().Drain(context.Background())
	// Output:
	// 200 draining: false count: 1
	// backup 3s detached: true
}

// For rolling updates: a ShutdownDelay, and the manager started on StopContext, which
// delays its stop. Setup checks the time budget and names the value to change.
func ExampleSetup_shutdownDelay() {
	mgrOpts := ctrl.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}
	opts := runnable.Options{ShutdownDelay: 5 * time.Second, GracePeriod: 30 * time.Second, Logger: logr.Discard()}
	cfg := &rest.Config{Host: "http://127.0.0.1:1"} // in an operator: ctrl.GetConfigOrDie()
	if _, err := runnable.Setup(cfg, &mgrOpts, opts); err != nil {
		fmt.Println(err)
	}

	timeout := 40 * time.Second
	mgrOpts.GracefulShutdownTimeout = &timeout
	q, err := runnable.Setup(cfg, &mgrOpts, opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("set up")
	// In main: the first SIGTERM begins the stop, the manager serves 5s more, then stops.
	//	mgr, err := ctrl.NewManager(cfg, mgrOpts); err = q.Add(mgr)
	//	err = mgr.Start(q.StopContext(ctrl.SetupSignalHandler()))
	_ = q
	// Output:
	// failed to set up quiesce: GracePeriod (30s) must be below the manager's GracefulShutdownTimeout (30s, controller-runtime's default, as the manager's Options set none): raise the manager's GracefulShutdownTimeout above 30s (ctrl.Options.GracefulShutdownTimeout, or the operator's own flag or setting for it), or lower GracePeriod
	// set up
}

// New makes a Runner without a manager, for unit tests and libraries: run it yourself, and
// Run drains the executor when ctx ends. A manager's main uses Setup.
func ExampleNew() {
	q := runnable.New(runnable.Options{GracePeriod: 5 * time.Second})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()

	err := q.Executor().Call(context.Background(), "job", func(context.Context) error { return nil })
	fmt.Println("call:", err)
	stop() // the end of the test
	fmt.Println("run:", <-done, "err:", q.Err())
	// Output:
	// call: <nil>
	// run: <nil> err: <nil>
}
