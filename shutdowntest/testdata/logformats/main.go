// Command logformats stands for an operator with quiesce that logs in the format --log-format
// names: zap-console and zap-json (controller-runtime's log/zap, development and production
// mode), slog-text and slog-json (log/slog's handlers through logr.FromSlogHandler),
// logrus-text and logrus-json (logrus' formatters through bombsimon/logrusr), or funcr
// (go-logr/funcr, a format shutdowntest does not read), at V(5), so that
// controller-runtime's "Reconciling" lines show. Its controller "logformat" reconciles the
// ConfigMaps labelled logformat=quiesce: the one named "hang" never returns (quiesce abandons
// it, the manager gives up on it); every other one works until its context is cancelled
// (quiesce's CancelAfter, 1s into the drain), then returns the context's error (a cut
// reconcile). Each logs "Working" once quiesce tracks it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/bombsimon/logrusr/v4"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/sirupsen/logrus"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

func main() {
	var metricsAddr, probeAddr, format string
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0", "")
	flag.StringVar(&format, "log-format", "zap-console", formats)
	flag.Parse()
	log, err := logger(format)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctrl.SetLogger(log)
	setupLog := ctrl.Log.WithName("setup")

	shutdownTimeout := 4 * time.Second
	mgrOpts := ctrl.Options{
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		GracefulShutdownTimeout: &shutdownTimeout,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{"logformat": "quiesce"})},
		}},
	}
	cfg := ctrl.GetConfigOrDie()
	q, err := runnable.Setup(cfg, &mgrOpts, runnable.Options{GracePeriod: 2 * time.Second, CancelAfter: time.Second})
	if err != nil {
		setupLog.Error(err, "Failed to set up quiesce")
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		setupLog.Error(err, "Failed to create manager")
		os.Exit(1)
	}
	if err := q.Add(mgr); err != nil {
		setupLog.Error(err, "Failed to add quiesce")
		os.Exit(1)
	}
	r := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		ctrl.LoggerFrom(ctx).Info("Working") // tracked by quiesce from now on
		if req.Name == "hang" {
			select {} // ignores its context: never returns
		}
		<-ctx.Done()
		return reconcile.Result{}, fmt.Errorf("failed to work: %w", ctx.Err())
	})
	err = builder.ControllerManagedBy(mgr).Named("logformat").For(&corev1.ConfigMap{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 10}).
		Complete(reconcilers.Wrap(q.Executor(), "logformat", r, reconcilers.WrapOptions{}))
	if err != nil {
		setupLog.Error(err, "Failed to create controller")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to add ready check")
		os.Exit(1)
	}
	if err := mgr.Start(q.StopContext(ctrl.SetupSignalHandler())); err != nil {
		setupLog.Error(err, "Problem running manager")
		os.Exit(1)
	}
	if q.Err() != nil {
		os.Exit(1)
	}
}

// logger returns a logger writing format to stderr, at V(5).
func logger(format string) (logr.Logger, error) {
	const v = 5
	switch format {
	case "zap-console", "zap-json":
		return zap.New(zap.UseDevMode(format == "zap-console"), zap.Level(zapcore.Level(-v))), nil
	case "slog-text":
		return logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-v)})), nil
	case "slog-json":
		return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-v)})), nil
	case "logrus-text", "logrus-json":
		l := logrus.New() // writes to stderr
		l.SetFormatter(&logrus.TextFormatter{})
		if format == "logrus-json" {
			l.SetFormatter(&logrus.JSONFormatter{})
		}
		l.SetLevel(logrus.InfoLevel + v) // logrusr logs V(n) at logrus' InfoLevel + n
		return logrusr.New(l), nil
	case "funcr":
		return funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: v}), nil
	}
	return logr.Logger{}, fmt.Errorf("invalid --log-format %q: %s", format, formats)
}

// formats are the values of --log-format.
const formats = "zap-console, zap-json, slog-text, slog-json, logrus-text, logrus-json or funcr"
