package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// Names shared with the runner, examples/rollout.
const (
	// LabelKey selects the ConfigMaps the operator reconciles and its webhook validates.
	LabelKey = "quiesce.dev/rollout"
	// DoneAnnotation holds the --id of the replica that reconciled the ConfigMap.
	DoneAnnotation = "quiesce.dev/reconciled-by"
	// ValidatePath is where the validating webhook is served.
	ValidatePath = "/validate-v1-configmap"
)

type config struct {
	id, namespace, leaseName        string
	quiesce, leaderElect, http2     bool
	selfWrite                       bool
	webhookHost, certDir            string
	webhookPort                     int
	metricsAddr, probeAddr          string
	grace, delay, work, retryPeriod time.Duration
	webhookWork                     time.Duration
	workers                         int
	stopPolicy                      string
}

// stopPolicies are the values of --stop-policy.
var stopPolicies = map[string]reconcilers.StopPolicy{
	"finish": reconcilers.FinishAtStop, "cancel": reconcilers.CancelAtStop, "handoff": reconcilers.HandOffAtStop,
}

func main() {
	var c config
	flag.StringVar(&c.id, "id", "", "The replica's identity, written in DoneAnnotation and logged with every reconcile.")
	flag.StringVar(&c.namespace, "namespace", "default", "The namespace of the ConfigMaps and of the lease.")
	flag.StringVar(&c.leaseName, "lease-name", "rollout-operator", "The name of the leader election lease.")
	flag.BoolVar(&c.quiesce, "quiesce", true, "Wire quiesce in (false: plain controller-runtime).")
	flag.BoolVar(&c.leaderElect, "leader-elect", true, "Elect a leader, with LeaderElectionReleaseOnCancel.")
	flag.StringVar(&c.webhookHost, "webhook-host", "", "The address the webhook server binds to; empty: every address.")
	flag.BoolVar(&c.http2, "webhook-http2", false, "Let the webhook server speak HTTP/2 (controller-runtime's default).")
	flag.IntVar(&c.webhookPort, "webhook-port", 9443, "The webhook server's port.")
	flag.StringVar(&c.certDir, "cert-dir", "", "The directory holding the webhook server's tls.crt and tls.key.")
	flag.StringVar(&c.metricsAddr, "metrics-bind-address", "0", "The metrics server's address; 0 disables it.")
	flag.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "The probe endpoint's address.")
	flag.DurationVar(&c.grace, "grace-period", 5*time.Second,
		"quiesce: how long, after the delay, in-flight work may take.")
	flag.DurationVar(&c.delay, "shutdown-delay", 2*time.Second,
		"quiesce: how long after SIGTERM readiness fails while the operator keeps serving.")
	flag.DurationVar(&c.work, "work", 200*time.Millisecond, "How long a reconcile works.")
	flag.DurationVar(&c.webhookWork, "webhook-work", 20*time.Millisecond,
		"How long the webhook validates a ConfigMap (a lookup, say).")
	flag.DurationVar(&c.retryPeriod, "leader-election-retry-period", time.Second,
		"How often a standby tries to acquire the lease.")
	flag.IntVar(&c.workers, "max-concurrent-reconciles", 10, "How many reconciles run at once.")
	flag.BoolVar(&c.selfWrite, "self-write", false,
		"The webhook validates the reconciles' own writes (an UPDATE adding "+DoneAnnotation+
			" must name a replica) and logs each one it admits.")
	flag.StringVar(&c.stopPolicy, "stop-policy", "finish",
		"quiesce: the controller's stop policy: finish (FinishAtStop), cancel (CancelAtStop) or handoff (HandOffAtStop).")
	opts := zap.Options{
		Level:           zapcore.InfoLevel,
		TimeEncoder:     zapcore.RFC3339NanoTimeEncoder,
		StacktraceLevel: zapcore.DPanicLevel,
	}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()

	logger := zap.New(zap.UseFlagOptions(&opts)).WithValues("replica", c.id)
	ctrl.SetLogger(logger)
	klog.SetLogger(logger) // leader election logs through klog
	os.Exit(run(ctrl.Log.WithName("setup"), c))
}

// run starts the manager and returns the process's exit code once it stopped.
func run(setupLog logr.Logger, c config) int {
	ctx := ctrl.SetupSignalHandler()
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		setupLog.Error(err, "Failed to get a kubeconfig")
		return 1
	}
	// A create every 25ms means a patch every 25ms: above client-go's default 20 QPS.
	restCfg.QPS, restCfg.Burst = 200, 400

	// The manager waits for its runnables a bit longer than the delay and the grace period.
	shutdownTimeout := c.delay + c.grace + 2*time.Second
	if !c.quiesce {
		shutdownTimeout = c.grace + 2*time.Second
	}
	whOpts := webhook.Options{Host: c.webhookHost, Port: c.webhookPort, CertDir: c.certDir}
	if !c.http2 {
		// HTTP/1.1 only, as kubebuilder scaffolds it (CVE-2023-44487 and CVE-2023-39325).
		whOpts.TLSOpts = []func(*tls.Config){func(t *tls.Config) { t.NextProtos = []string{"http/1.1"} }}
	}
	whs := webhook.NewServer(whOpts)
	retry := c.retryPeriod
	mgrOpts := ctrl.Options{
		Scheme:                        scheme.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress:        c.probeAddr,
		WebhookServer:                 whs,
		LeaderElection:                c.leaderElect,
		LeaderElectionID:              c.leaseName,
		LeaderElectionNamespace:       c.namespace,
		LeaderElectionReleaseOnCancel: true,
		RetryPeriod:                   &retry,
		GracefulShutdownTimeout:       &shutdownTimeout,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{c.namespace: {}},
			ByObject: map[client.Object]cache.ByObject{
				&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(nil).Add(mustExists(LabelKey))},
			},
		},
	}
	policy, ok := stopPolicies[c.stopPolicy]
	if !ok {
		setupLog.Error(fmt.Errorf("unknown --stop-policy %q (use finish, cancel or handoff)", c.stopPolicy), "Invalid flags")
		return 1
	}
	var q *runnable.Runnable
	if c.quiesce {
		// quiesce: webhook requests are tracked calls; the contexts it keeps alive end with the
		// lease (fencing); a replica whose stop began never acquires it.
		var err error
		if q, err = setupQuiesce(restCfg, &mgrOpts, c); err != nil {
			setupLog.Error(err, "Quiesce setup refused")
			return 1
		}
	}
	mgr, err := ctrl.NewManager(restCfg, mgrOpts)
	if err != nil {
		setupLog.Error(err, "Failed to create manager")
		return 1
	}

	var r reconcile.Reconciler = &Reconciler{Client: mgr.GetClient(), ID: c.id, Work: c.work}
	if q != nil {
		if err := q.Add(mgr); err != nil {
			setupLog.Error(err, "Failed to add quiesce")
			return 1
		}
		r = reconcilers.Wrap(q.Executor(), "rollout", r, reconcilers.WrapOptions{Stop: policy})
	} else if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to add readyz check")
		return 1
	}
	mgr.GetWebhookServer().Register(ValidatePath, &webhook.Admission{Handler: &validator{
		work: c.webhookWork, ownWrites: c.selfWrite, log: ctrl.Log.WithName("validator"),
	}})
	if err := ctrl.NewControllerManagedBy(mgr).Named("rollout").For(&corev1.ConfigMap{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: c.workers}).Complete(r); err != nil {
		setupLog.Error(err, "Failed to create controller", "controller", "rollout")
		return 1
	}

	setupLog.Info("Starting manager", "quiesce", c.quiesce, "stopPolicy", c.stopPolicy, "shutdownDelay", c.delay.String(),
		"gracePeriod", c.grace.String(), "gracefulShutdownTimeout", shutdownTimeout.String())
	if q != nil {
		ctx = q.StopContext(ctx) // the manager's stop begins ShutdownDelay after SIGTERM
	}
	if err := mgr.Start(ctx); err != nil {
		setupLog.Error(err, "Manager stopped with an error", "exitCode", 1)
		return 1
	}
	if q != nil {
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
	}
	setupLog.Info("Exiting", "exitCode", 0)
	return 0
}
