package main

import (
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// wrapWebhookServer: quiesce's webhook server finishes what it started (see runnable.WebhookServer).
func wrapWebhookServer(s webhook.Server) webhook.Server {
	return s // TODO(rollout): runnable.WebhookServer(s) once it exists
}

// addQuiesce adds quiesce's runnable to mgr and wraps r: in-flight reconciles finish (their
// contexts are never cancelled before the grace period ends), and the stop waits delay
// first, readiness failing, while the webhooks keep serving.
func addQuiesce(mgr ctrl.Manager, c config, shutdownTimeout time.Duration, r reconcile.Reconciler) (
	*runnable.Runnable, reconcile.Reconciler, error,
) {
	q, err := runnable.Add(mgr, runnable.Options{
		GracePeriod: c.grace,
		Options:     drain.Options{CancelAfter: c.grace},
	})
	if err != nil {
		return nil, nil, err
	}
	_ = shutdownTimeout
	return q, reconcilers.Wrap(q.Executor(), "rollout", r), nil
}
