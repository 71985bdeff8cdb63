// Command secure stands for an operator whose metrics server, and quiesce's /debug/quiesce on
// it, serve HTTPS with authentication and authorization (kubebuilder's default; its
// certificate from --metrics-cert-path, as kubebuilder's), and which
// runs with leader election when --leader-elect is set (its lease's namespace from the
// POD_NAMESPACE environment variable, which the harness sets). Each ConfigMap labelled
// secure=quiesce gets a reconcile with one handler call, "secure/<namespace>/<name>/work",
// that runs until the operator stops.
package main

import (
	"context"
	"flag"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

func main() {
	var metricsAddr, probeAddr, metricsCertPath string
	var secure, leaderElect bool
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "")
	flag.StringVar(&metricsCertPath, "metrics-cert-path", "", "The directory of the metrics server's tls.crt and tls.key.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0", "")
	flag.BoolVar(&secure, "metrics-secure", true, "")
	flag.BoolVar(&leaderElect, "leader-elect", false, "")
	qopts := runnable.Options{GracePeriod: 2 * time.Second}
	qopts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	log := ctrl.Log.WithName("setup")

	metrics := metricsserver.Options{BindAddress: metricsAddr, SecureServing: secure, CertDir: metricsCertPath}
	if secure {
		metrics.FilterProvider = authenticated
	}
	shutdownTimeout := 10 * time.Second
	mgrOpts := ctrl.Options{
		Metrics:                       metrics,
		HealthProbeBindAddress:        probeAddr,
		GracefulShutdownTimeout:       &shutdownTimeout,
		LeaderElection:                leaderElect,
		LeaderElectionID:              "secure-operator",
		LeaderElectionNamespace:       os.Getenv("POD_NAMESPACE"), // "": in a cluster, the pod's own
		LeaderElectionReleaseOnCancel: true,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{"secure": "quiesce"})},
		}},
	}
	cfg := ctrl.GetConfigOrDie()
	q, err := runnable.Setup(cfg, &mgrOpts, qopts)
	if err != nil {
		log.Error(err, "Failed to set up quiesce")
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		log.Error(err, "Failed to create manager")
		os.Exit(1)
	}
	if err := q.Add(mgr); err != nil {
		log.Error(err, "Failed to add quiesce")
		os.Exit(1)
	}
	r := reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, reconcilers.Call(ctx, "work", func(ctx context.Context) error {
			<-ctx.Done() // until the drain cancels it
			return nil
		})
	})
	err = builder.ControllerManagedBy(mgr).Named("secure").For(&corev1.ConfigMap{}).
		Complete(reconcilers.Wrap(q.Executor(), "secure", r, reconcilers.WrapOptions{}))
	if err != nil {
		log.Error(err, "Failed to create controller")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Failed to add ready check")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "Failed to run manager")
		os.Exit(1)
	}
	if q.Err() != nil {
		os.Exit(1)
	}
}

// authenticated serves only requests whose bearer token the API server authenticates and
// authorizes to GET the path.
func authenticated(c *rest.Config, _ *http.Client) (metricsserver.Filter, error) {
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	return func(_ logr.Logger, h http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			token, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
			if !ok {
				http.Error(w, "Unauthorized", http.StatusUnauthorized)
				return
			}
			tr, err := cs.AuthenticationV1().TokenReviews().Create(req.Context(),
				&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
			if err != nil || !tr.Status.Authenticated {
				http.Error(w, "Unauthorized", http.StatusUnauthorized)
				return
			}
			u := tr.Status.User
			sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(req.Context(),
				&authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User: u.Username, Groups: u.Groups, UID: u.UID,
					NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: req.URL.Path, Verb: "get"},
				}}, metav1.CreateOptions{})
			if err != nil || !sar.Status.Allowed {
				http.Error(w, "Forbidden", http.StatusForbidden)
				return
			}
			h.ServeHTTP(w, req)
		}), nil
	}, nil
}
