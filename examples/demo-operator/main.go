package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/runnable"
)

// The label labelKey=labelValue selects the ConfigMaps the operator reconciles.
const (
	labelKey   = "demo"
	labelValue = "quiesce"
)

func main() {
	var (
		metricsAddr string
		probeAddr   string
		debugAddr   string
		grace       time.Duration
		reportAfter time.Duration
		reportEvery time.Duration
		cancelAfter time.Duration
		work        time.Duration
		workers     int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0",
		"The address the metrics server (/metrics) binds to, plain HTTP without authentication; 0 disables it.")
	flag.StringVar(&debugAddr, "quiesce-debug-address", "",
		"The loopback address quiesce serves /debug/quiesce on (e.g. 127.0.0.1:8083); empty: none.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0",
		"The address the probe endpoint binds to; 0 disables it.")
	flag.DurationVar(&grace, "grace-period", 6*time.Second,
		"How long, after SIGTERM, the operator waits for tracked calls to return.")
	flag.DurationVar(&reportAfter, "report-after", time.Second,
		"When, after SIGTERM, the first report of pending calls is logged.")
	flag.DurationVar(&reportEvery, "report-every", 2*time.Second, "The interval between later reports.")
	flag.DurationVar(&cancelAfter, "cancel-after", 4*time.Second,
		"When, after SIGTERM, the contexts of calls still running are cancelled (0: at once, <0: never).")
	flag.IntVar(&workers, "max-concurrent-reconciles", 10,
		"How many reconciles run at once: a hanging handler holds one until its context ends.")
	flag.DurationVar(&work, "work", 2*time.Second, "How long the snapshot handler works.")
	opts := zap.Options{
		Development: true,
		// Info, not Debug: the demo's log is meant to be read. -zap-log-level=debug shows more.
		Level: zapcore.InfoLevel,
		// No stack trace under error lines: quiesce's own lines say where calls block.
		StacktraceLevel: zapcore.DPanicLevel,
	}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	setupLog := ctrl.Log.WithName("setup")
	os.Exit(run(setupLog, managerConfig{
		metricsAddr: metricsAddr,
		probeAddr:   probeAddr,
		debugAddr:   debugAddr,
		grace:       grace,
		reportAfter: reportAfter,
		reportEvery: reportEvery,
		cancelAfter: cancelAfter,
		work:        work,
		workers:     workers,
	}))
}

type managerConfig struct {
	metricsAddr, probeAddr, debugAddr            string
	grace, reportAfter, reportEvery, cancelAfter time.Duration
	work                                         time.Duration
	workers                                      int
}

// cacheOptions make the manager's cache hold only the ConfigMaps the operator reconciles.
func cacheOptions() cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{labelKey: labelValue})},
	}}
}

// run starts the manager and returns the process's exit code once it stopped.
func run(setupLog logr.Logger, c managerConfig) int {
	// The first SIGTERM or SIGINT cancels ctx: the manager stops and the quiesce runnable
	// drains. controller-runtime's handler calls os.Exit(1) on a second signal, at once,
	// without waiting for the drain: a second Ctrl-C is the way out of a long grace period.
	ctx := ctrl.SetupSignalHandler()

	// The manager must wait for its runnables a bit longer than the runnable waits for its
	// calls, so that the runnable can name what it abandons before the manager gives up.
	shutdownTimeout := c.grace + 2*time.Second
	// The metrics server serves plain HTTP without authentication: fine for the demo, which
	// binds it to 127.0.0.1. A deployed operator sets SecureServing and a FilterProvider, as
	// kubebuilder scaffolds do. quiesce serves /debug/quiesce on no server that authenticates
	// no one: the demo reads it on a loopback listener of its own (DebugAddress).
	mgrOpts := ctrl.Options{
		Scheme:                  scheme.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress:  c.probeAddr,
		GracefulShutdownTimeout: &shutdownTimeout,
		Cache:                   cacheOptions(),
	}
	// quiesce: one runnable owns the executor that tracks every reconcile and handler call,
	// and drains it when the manager stops. Setup comes before ctrl.NewManager, which it
	// checks GracePeriod against (GracefulShutdownTimeout).
	cfg := ctrl.GetConfigOrDie()
	q, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{
		DebugAddress: c.debugAddr,
		GracePeriod:  c.grace,
		ReportAfter:  c.reportAfter,
		ReportEvery:  c.reportEvery,
		CancelAfter:  c.cancelAfter,
	})
	if err != nil {
		setupLog.Error(err, "Quiesce setup refused")
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		setupLog.Error(err, "Failed to create manager")
		return 1
	}
	if err := q.Add(mgr); err != nil {
		setupLog.Error(err, "Failed to add quiesce")
		return 1
	}

	r := &ConfigMapReconciler{Client: mgr.GetClient(), Work: c.work}
	if err := r.SetupWithManager(mgr, q.Executor(), c.workers); err != nil {
		setupLog.Error(err, "Failed to create controller", "controller", "demo")
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to add health check")
		return 1
	}

	setupLog.Info("Starting manager", "gracePeriod", c.grace.String(), "cancelAfter", c.cancelAfter.String(),
		"gracefulShutdownTimeout", shutdownTimeout.String())
	if err := mgr.Start(ctx); err != nil {
		setupLog.Error(err, "Manager stopped with an error", "exitCode", 1)
		return 1
	}

	// controller-runtime does not return a runnable's error from Start once it stops, so
	// ask the runnable whether every call returned.
	select {
	case <-q.Done():
	default:
		setupLog.Error(fmt.Errorf("the manager gave up after %s", shutdownTimeout),
			"Quiesce runnable did not finish draining", "exitCode", 1)
		return 1
	}
	if err := q.Err(); err != nil {
		setupLog.Error(err, "Exiting: calls were still running at the end of the grace period", "exitCode", 1)
		return 1
	}
	setupLog.Info("Exiting: every call returned", "exitCode", 0)
	return 0
}
