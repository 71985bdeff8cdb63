// Command helm-operator installs and upgrades a Helm release per labelled ConfigMap with Helm 3
// (Atomic, Wait, WaitForJobs, a long timeout), with quiesce (--quiesce, the default) or as plain
// controller-runtime (--quiesce=false), so that its tests can stop both mid-upgrade and compare.
// With --leader-elect, replicas elect a leader (LeaderElectionReleaseOnCancel) and
// --stop-policy chooses how quiesce's leader stops: finish (FinishAtStop) or handoff
// (HandOffAtStop: the lease handed over at once, the upgrade in flight claimed and finished).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"

	"example.com/helm-operator/chart"
	"example.com/helm-operator/controller"
)

// LeaderElectionID is the name of the leader election Lease, in --namespace (or, empty, the
// Pod's own namespace, as controller-runtime finds it in-cluster).
const LeaderElectionID = "helm-operator.example.com"

// stopPolicies are the values of --stop-policy.
var stopPolicies = map[string]reconcilers.StopPolicy{
	"finish": reconcilers.FinishAtStop, "handoff": reconcilers.HandOffAtStop,
}

func main() {
	var (
		metricsAddr, probeAddr string
		withQuiesce            bool
		shutdownTimeout        time.Duration
		chartTimeout           time.Duration
		pollInterval           time.Duration
		namespace              string
		cleanup                time.Duration
		markFailed             bool
		leaderElect            bool
		retryPeriod            time.Duration
		stopPolicy             string
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0",
		"The address the metrics server binds to (plain HTTP); 0 disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	flag.BoolVar(&withQuiesce, "quiesce", true, "Stop through quiesce; false: plain controller-runtime.")
	flag.DurationVar(&shutdownTimeout, "graceful-shutdown-timeout", 30*time.Second,
		"The manager's GracefulShutdownTimeout.")
	flag.DurationVar(&chartTimeout, "chart-timeout", 10*time.Minute,
		"Helm's --timeout for install, upgrade and the atomic rollback.")
	flag.DurationVar(&pollInterval, "helm-poll-interval", 0, "How often Helm's wait polls; 0: Helm's own (2s).")
	flag.StringVar(&namespace, "namespace", "", "The one namespace whose ConfigMaps are reconciled; empty: all.")
	flag.DurationVar(&cleanup, "cleanup", 0,
		"The upgrade's cleanup window (quiesce's reconcilers.WrapOptions.Cleanup): time kept for Helm's "+
			"atomic rollback between the upgrade's cancel and the end of the grace period; 0: none.")
	flag.BoolVar(&markFailed, "mark-failed-on-abandon", false,
		"Mark a release whose upgrade or rollback quiesce abandons as failed (reconcilers.WrapOptions.OnAbandon), "+
			"so that the next operator upgrades it instead of failing on \"another operation is in progress\".")
	flag.BoolVar(&leaderElect, "leader-elect", false,
		"Elect a leader among the replicas (the Lease "+LeaderElectionID+" in --namespace), released on cancel.")
	flag.DurationVar(&retryPeriod, "leader-election-retry-period", 2*time.Second,
		"How often the leader renews the lease and a standby tries to acquire it.")
	flag.StringVar(&stopPolicy, "stop-policy", "finish",
		"quiesce: the controller's stop policy (reconcilers.WrapOptions.Stop): finish (FinishAtStop) or "+
			"handoff (HandOffAtStop, which needs --leader-elect).")
	var qopts runnable.Options
	qopts.BindFlags(flag.CommandLine)
	// Not one of BindFlags': the tests scale it down with the rest.
	flag.DurationVar(&qopts.ReportAfter, "quiesce-report-after", 0,
		"When the drain's first report of pending calls comes; 0: 1s.")
	zopts := zap.Options{Development: true, StacktraceLevel: zapcore.DPanicLevel}
	zopts.BindFlags(flag.CommandLine)
	flag.Parse()

	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts)))
	log := ctrl.Log.WithName("setup")

	policy, ok := stopPolicies[stopPolicy]
	if !ok || policy == reconcilers.HandOffAtStop && !leaderElect {
		log.Error(fmt.Errorf("invalid --stop-policy %q: use finish, or handoff with --leader-elect", stopPolicy),
			"Invalid flags")
		os.Exit(1)
	}
	c, err := chart.Load()
	if err != nil {
		log.Error(err, "Failed to load the chart")
		os.Exit(1)
	}
	cfg := ctrl.GetConfigOrDie()
	mgrOpts := ctrl.Options{
		Scheme:                  scheme.Scheme,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		GracefulShutdownTimeout: &shutdownTimeout,
		// As kubebuilder scaffolds it; the lease's other timings are controller-runtime's.
		LeaderElection:                leaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       namespace,
		LeaderElectionReleaseOnCancel: true,
		RetryPeriod:                   &retryPeriod,
	}
	if namespace != "" {
		mgrOpts.Cache.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	var q *runnable.Runnable
	if withQuiesce {
		if q, err = runnable.Setup(cfg, &mgrOpts, qopts); err != nil {
			log.Error(err, "Failed to set up quiesce")
			os.Exit(1)
		}
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		log.Error(err, "Failed to make the manager")
		os.Exit(1)
	}
	var ex *drain.Executor
	if q != nil {
		if err := q.Add(mgr); err != nil {
			log.Error(err, "Failed to set up quiesce")
			os.Exit(1)
		}
		ex = q.Executor()
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		log.Error(err, "Failed to add the readyz check")
		os.Exit(1)
	}
	r := &controller.Reconciler{Client: mgr.GetClient(), Config: mgr.GetConfig(), Chart: c,
		Timeout: chartTimeout, PollInterval: pollInterval}
	wopts := reconcilers.WrapOptions{Cleanup: cleanup, Stop: policy}
	if markFailed {
		wopts.OnAbandon = r.MarkFailed
	}
	if err := r.SetupWithManager(mgr, ex, wopts); err != nil {
		log.Error(err, "Failed to set up the controller")
		os.Exit(1)
	}

	log.Info("Starting manager", "quiesce", withQuiesce, "leaderElect", leaderElect, "stopPolicy", stopPolicy)
	ctx := ctrl.SetupSignalHandler()
	if q != nil {
		ctx = q.StopContext(ctx)
	}
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "Failed to run manager")
		os.Exit(1)
	}
	if q != nil && q.Err() != nil {
		log.Error(q.Err(), "Calls were still running at the end of the grace period")
		os.Exit(1)
	}
}
