package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/examples/cobra-operator/controller"
	"github.com/quiesce-dev/quiesce/runnable"
)

// options are the command's flags.
type options struct {
	metricsAddr, probeAddr  string
	leaderElect             bool
	leaderElectionNamespace string
	gracefulShutdownTimeout time.Duration
	webhookPort             int
	webhookCertDir          string
	logFormat               string
	logVerbosity            int
	quiesce                 runnable.Options // quiesce: its flags, in a section of their own
}

// newCommand returns the operator's root command; run is what it runs once its flags are
// parsed and checked (main: start).
func newCommand(run func(ctx context.Context, o *options) error) *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "cobra-operator",
		Short: "Mirrors labelled ConfigMaps.",
		Long: "cobra-operator mirrors each ConfigMap labelled " + controller.MirrorLabel + "=true to a ConfigMap " +
			"of its own, and validates them.",
		SilenceUsage: true, // an error is not a usage mistake
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.logFormat != "text" && o.logFormat != "json" {
				return fmt.Errorf("--log-format is %q: set it to text or json", o.logFormat)
			}
			return run(cmd.Context(), o)
		},
	}
	var fss cliflag.NamedFlagSets
	fs := fss.FlagSet("generic")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080",
		"The address the metrics endpoint binds to; 0 disables it.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect one leader among the replicas to run the controller.")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", "",
		"The namespace of the leader election lease. Empty: the pod's own.")
	fs.DurationVar(&o.gracefulShutdownTimeout, "graceful-shutdown-timeout", 30*time.Second,
		"How long the operator waits, once it stops, for its controllers and servers to stop. "+
			"The pod's terminationGracePeriodSeconds must exceed it plus --quiesce-shutdown-delay.")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "The port the webhook server serves on.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "", "The directory of tls.crt and tls.key. "+
		"Empty: <temp-dir>/k8s-webhook-server/serving-certs.")
	if kubeconfig := flag.CommandLine.Lookup("kubeconfig"); kubeconfig != nil { // controller-runtime's
		fs.AddGoFlag(kubeconfig)
	}
	logs := fss.FlagSet("logging")
	logs.StringVar(&o.logFormat, "log-format", "text", "The log's format: text or json.")
	logs.IntVarP(&o.logVerbosity, "v", "v", 0, "The log's verbosity: 0 info; 1 and up, more detail.")
	o.quiesce.BindPFlags(fss.FlagSet("quiesce")) // quiesce: --quiesce-shutdown-delay, --quiesce-grace-period, ...

	for _, f := range fss.FlagSets {
		cmd.Flags().AddFlagSet(f)
	}
	cliflag.SetUsageAndHelpFunc(cmd, fss, 100)
	return cmd
}

// logger is the operator's logger: slog, in text form unless --log-format=json, at
// --v's verbosity (logr's V(n) is slog's level -n).
func (o *options) logger() logr.Logger {
	h := &slog.HandlerOptions{Level: slog.Level(-o.logVerbosity)}
	if o.logFormat == "json" {
		return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, h))
	}
	return logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, h))
}

// start runs the operator until ctx ends (SIGTERM): it sets the loggers up, then the
// manager (setup), then runs it.
func start(ctx context.Context, o *options) error {
	log := o.logger()
	ctrl.SetLogger(log)
	klog.SetLogger(log)
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("failed to load the kubeconfig: %w", err)
	}
	mgr, q, err := o.setup(cfg)
	if err != nil {
		return err
	}
	log.WithName("setup").Info("Starting manager")
	// quiesce: StopContext keeps the manager serving for --quiesce-shutdown-delay after SIGTERM.
	if err := mgr.Start(q.StopContext(ctx)); err != nil {
		return fmt.Errorf("failed to run manager: %w", err)
	}
	// quiesce: calls still running at the end of the grace period, named in the log.
	if err := q.Err(); err != nil {
		return fmt.Errorf("calls were still running at the end of the grace period: %w", err)
	}
	return nil
}

// setup makes the manager from the flags, with quiesce, the controller and its webhook.
// Its errors name the flag to change.
func (o *options) setup(cfg *rest.Config) (ctrl.Manager, *runnable.Runnable, error) {
	mgrOpts := ctrl.Options{
		Scheme:                  scheme.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "cobra-operator.quiesce.dev",
		LeaderElectionNamespace: o.leaderElectionNamespace,
		// The next leader may start as soon as this one stopped (after quiesce's wait).
		LeaderElectionReleaseOnCancel: true,
		GracefulShutdownTimeout:       &o.gracefulShutdownTimeout,
		WebhookServer:                 webhook.NewServer(webhook.Options{Port: o.webhookPort, CertDir: o.webhookCertDir}),
	}
	// quiesce: Setup on the complete Options, before ctrl.NewManager.
	q, err := runnable.Setup(cfg, &mgrOpts, o.quiesce)
	if err != nil && strings.Contains(err.Error(), "GracefulShutdownTimeout") {
		// quiesce names the manager's Options field; here a flag sets it.
		return nil, nil, fmt.Errorf("%w (GracefulShutdownTimeout: --graceful-shutdown-timeout)", err)
	}
	if err != nil {
		return nil, nil, err
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to create manager: %w", err)
	}
	// quiesce: its runnable, readyz check "quiesce" and metrics.
	if err := q.Add(mgr); err != nil {
		return nil, nil, err
	}
	// quiesce: q.Executor() tracks each reconcile.
	if err := (&controller.Mirror{Client: mgr.GetClient(), Executor: q.Executor()}).SetupWithManager(mgr); err != nil {
		return nil, nil, fmt.Errorf("failed to set up controller %s: %w", controller.Name, err)
	}
	err = errors.Join(mgr.AddHealthzCheck("healthz", healthz.Ping), mgr.AddReadyzCheck("readyz", healthz.Ping))
	if err != nil {
		return nil, nil, fmt.Errorf("failed to set up health checks: %w", err)
	}
	return mgr, q, nil
}
