package main

import (
	"flag"
	"os"

	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quiesce-dev/quiesce/examples/config-operator/config"
	"github.com/quiesce-dev/quiesce/examples/config-operator/controller"
	"github.com/quiesce-dev/quiesce/runnable"
)

func main() {
	var configFile string
	flag.StringVar(&configFile, "config", "/etc/config-operator/config.yaml", "The operator's config file.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	os.Exit(run(configFile))
}

// run starts the operator and returns the process's exit code once it stopped.
func run(configFile string) int {
	setupLog := ctrl.Log.WithName("setup")
	c, err := config.Load(configFile)
	if err != nil {
		setupLog.Error(err, "Failed to load the config file")
		return 1
	}
	// The manager's Options (with the webhook server) and quiesce's, both from the file.
	mgrOpts, qopts, err := c.Options(scheme.Scheme)
	if err != nil {
		setupLog.Error(err, "Invalid config file", "path", configFile)
		return 1
	}

	// quiesce: Setup on the complete Options, before ctrl.NewManager; it observes the lease
	// (leaderElect) and wraps the webhook server built by the config package.
	cfg := ctrl.GetConfigOrDie()
	q, err := runnable.Setup(cfg, &mgrOpts, qopts)
	if err != nil {
		setupLog.Error(err, "Quiesce setup refused")
		return 1
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		setupLog.Error(err, "Failed to create manager")
		return 1
	}
	// quiesce: its runnable, the readyz check "quiesce" and its metrics.
	if err := q.Add(mgr); err != nil {
		setupLog.Error(err, "Quiesce setup refused")
		return 1
	}

	if err := (&controller.ConfigMapReconciler{
		Client:    mgr.GetClient(),
		Publisher: &controller.HTTPPublisher{URL: c.PublishURL},
		Executor:  q.Executor(),
	}).SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "Failed to create controller", "controller", controller.Name)
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to set up health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to set up ready check")
		return 1
	}

	setupLog.Info("Starting manager")
	// quiesce: StopContext keeps the manager serving for quiesce.shutdownDelay after SIGTERM.
	if err := mgr.Start(q.StopContext(ctrl.SetupSignalHandler())); err != nil {
		setupLog.Error(err, "Failed to run manager")
		return 1
	}
	if err := q.Err(); err != nil {
		setupLog.Error(err, "Calls were still running at the end of the grace period")
		return 1
	}
	return 0
}
