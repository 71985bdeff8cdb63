package main

import (
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/quiesce-dev/quiesce/runnable"
)

// setupQuiesce prepares quiesce on the manager's Options. At SIGTERM, readiness fails on
// every replica while everything keeps serving for --shutdown-delay (main starts the manager
// with q.StopContext); then in-flight reconciles and webhook requests finish within
// --grace-period, their contexts live (cancelled at 4/5 of it at the latest), and the
// webhooks stop last.
func setupQuiesce(cfg *rest.Config, opts *ctrl.Options, c config) (*runnable.Runnable, error) {
	return runnable.Setup(cfg, opts, runnable.Options{GracePeriod: c.grace, ShutdownDelay: c.delay})
}
