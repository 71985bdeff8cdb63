package main

import (
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// addQuiesce adds quiesce's runnable to mgr, created with opts, and wraps r. At SIGTERM,
// readiness fails on every replica while everything keeps serving for --shutdown-delay
// (main starts the manager with q.StopContext); then in-flight reconciles and webhook
// requests finish within --grace-period, their contexts live (cancelled at 4/5 of it at
// the latest), and the webhooks stop last.
func addQuiesce(mgr ctrl.Manager, opts *ctrl.Options, c config, r reconcile.Reconciler) (
	*runnable.Runnable, reconcile.Reconciler, error,
) {
	q, err := runnable.Add(mgr, runnable.Options{
		GracePeriod:    c.grace,
		ShutdownDelay:  c.delay,
		ManagerOptions: opts, // Add checks the time budget and connects the WebhookServer
	})
	if err != nil {
		return nil, nil, err
	}
	return q, reconcilers.Wrap(q.Executor(), "rollout", r, reconcilers.WrapOptions{}), nil
}
