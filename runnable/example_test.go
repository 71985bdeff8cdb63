package runnable_test

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/runnable"
)

// Add the runnable to a manager in main.go; wrap reconcilers with its executor; after
// mgr.Start returned, Err says whether calls had to be abandoned.
func ExampleAdd() {
	// In an operator: ctrl.GetConfigOrDie() and your usual options.
	mgr, err := ctrl.NewManager(&rest.Config{Host: "http://127.0.0.1:1"}, ctrl.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	q, err := runnable.Add(mgr, runnable.Options{
		GracePeriod: 25 * time.Second,                             // below GracefulShutdownTimeout
		Options:     drain.Options{CancelAfter: 20 * time.Second}, // let reconciles finish
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// ...Complete(reconcilers.Wrap(q.Executor(), "memcached", r))

	ctx, stop := context.WithCancel(context.Background()) // ctrl.SetupSignalHandler()
	stop()                                                // as if SIGTERM came at once
	if err := mgr.Start(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println("abandoned calls:", q.Err() != nil)
	// Output: abandoned calls: false
}
