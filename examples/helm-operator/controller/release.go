// Package controller is the helm-operator example's reconciler: it installs and upgrades a
// Helm release per ConfigMap with Helm 3's action package, Atomic, Wait and WaitForJobs, as
// operators built on Helm do today.
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// Name is the controller's name: quiesce names each reconcile "release/<namespace>/<name>" and
// the Helm call in it "release/<namespace>/<name>/upgrade" (or ".../install").
const Name = "release"

// LabelKey selects the ConfigMaps the operator reconciles (LabelKey=true). Each stands for one
// release, named after it, in its namespace, at the chart value version = data["version"].
const LabelKey = "helm-operator.example.com/release"

// Reconciler installs the release of a ConfigMap, or upgrades it to the ConfigMap's version.
type Reconciler struct {
	Client client.Client
	Config *rest.Config
	Chart  *chart.Chart
	// Timeout is Helm's --timeout: how long an install or upgrade waits for its resources,
	// and, after a failure, how long its atomic rollback waits.
	Timeout time.Duration
	// PollInterval is how often Helm's wait reads the resources. 0: Helm's own (2s). Tests
	// that scale time down scale it too (see pollClient).
	PollInterval time.Duration
}

// Reconcile runs the Helm action the ConfigMap asks for: install when there is no release,
// upgrade when the last one is not deployed at the ConfigMap's version. A release left
// pending (pending-upgrade, pending-rollback) by a process that died makes every upgrade fail
// with Helm's "another operation (install/upgrade/rollback) is in progress".
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	cm := &corev1.ConfigMap{}
	if err := r.Client.Get(ctx, req.NamespacedName, cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	version := cm.Data["version"]
	if version == "" {
		return ctrl.Result{}, nil
	}
	cfg, err := r.actionConfig(log, req.Namespace, 0)
	if err != nil {
		return ctrl.Result{}, err
	}
	vals := map[string]any{"version": version}

	last, err := cfg.Releases.Last(req.Name)
	switch {
	case errors.Is(err, driver.ErrReleaseNotFound):
		install := action.NewInstall(cfg)
		install.ReleaseName, install.Namespace = req.Name, req.Namespace
		install.Atomic, install.Wait, install.WaitForJobs, install.Timeout = true, true, true, r.Timeout
		// A blocking call as a tracked call: quiesce names it, with this line, while it runs.
		if err := reconcilers.Call(ctx, "install", func(ctx context.Context) error {
			_, err := install.RunWithContext(ctx, r.Chart, vals)
			return err
		}); err != nil {
			return ctrl.Result{}, fmt.Errorf("failed to install: %w", err)
		}
		log.Info("Installed", "version", version)
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("failed to read the release: %w", err)
	case last.Info.Status == release.StatusDeployed && last.Config["version"] == version:
		return ctrl.Result{}, nil
	default:
		upgrade := action.NewUpgrade(cfg)
		upgrade.Namespace = req.Namespace
		upgrade.Atomic, upgrade.Wait, upgrade.WaitForJobs, upgrade.Timeout = true, true, true, r.Timeout
		// Helm's upgrade honours ctx: once it ends, the release is marked failed and, Atomic,
		// rolled back; RunWithContext returns when the rollback is done, however long it takes.
		if err := reconcilers.Call(ctx, "upgrade", func(ctx context.Context) error {
			_, err := upgrade.RunWithContext(ctx, req.Name, r.Chart, vals)
			return err
		}); err != nil {
			return ctrl.Result{}, fmt.Errorf("failed to upgrade: %w", err)
		}
		log.Info("Upgraded", "version", version)
	}
	return ctrl.Result{}, nil
}

// MarkFailed is the operator's quiesce OnAbandon hook (reconcilers.WrapOptions.OnAbandon):
// quiesce calls it for a reconcile still running at the end of its grace period, an upgrade or
// its atomic rollback that the process's exit is about to cut. If the release's last revision
// is pending, it marks it failed, so that the next operator upgrades it (Helm upgrades a failed
// release, and refuses a pending one with "another operation is in progress"). It runs while
// the abandoned call may still run: if the rollback ends in between, its deployed record is
// overwritten with failed, which costs the next operator one more upgrade, never a stuck
// release. Helm's storage takes no context: its requests are bounded by ctx's deadline.
func (r *Reconciler) MarkFailed(ctx context.Context, req ctrl.Request) {
	log := logf.FromContext(ctx).WithValues("namespace", req.Namespace, "name", req.Name)
	var timeout time.Duration
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	cfg, err := r.actionConfig(log, req.Namespace, timeout)
	if err != nil {
		log.Error(err, "Failed to mark the release failed")
		return
	}
	last, err := cfg.Releases.Last(req.Name)
	switch {
	case err != nil:
		log.Error(err, "Failed to mark the release failed")
		return
	case !last.Info.Status.IsPending():
		log.Info("Release not pending: left as it is", "revision", last.Version, "status", last.Info.Status)
		return
	}
	was := last.Info.Status
	last.SetStatus(release.StatusFailed, "abandoned at the operator's stop")
	if err := cfg.Releases.Update(last); err != nil {
		log.Error(err, "Failed to mark the release failed", "revision", last.Version)
		return
	}
	log.Info("Marked the release failed", "revision", last.Version, "was", was)
}

// actionConfig is Helm's configuration for namespace: releases stored in Secrets, as the helm
// command stores them, its debug log at V(1), each request bounded by timeout (0: none).
func (r *Reconciler) actionConfig(
	log logr.Logger, namespace string, timeout time.Duration,
) (*action.Configuration, error) {
	helmLog := log.WithName("helm").V(1)
	cfg := &action.Configuration{}
	rc := rest.CopyConfig(r.Config)
	rc.Timeout = timeout
	getter := newRESTClientGetter(rc, namespace)
	if err := cfg.Init(getter, namespace, "secret", func(format string, v ...any) {
		helmLog.Info("Helm", "detail", fmt.Sprintf(format, v...))
	}); err != nil {
		return nil, fmt.Errorf("failed to configure helm: %w", err)
	}
	if r.PollInterval > 0 {
		cfg.KubeClient = newPollClient(cfg.KubeClient, getter, r.PollInterval)
	}
	return cfg, nil
}

// SetupWithManager registers the reconciler, run through ex's wrapper when ex is not nil
// (quiesce); nil: as plain controller-runtime runs it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, ex *drain.Executor, opts reconcilers.WrapOptions) error {
	var rec reconcile.Reconciler = r
	if ex != nil {
		rec = reconcilers.Wrap(ex, Name, r, opts)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		WithEventFilter(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetLabels()[LabelKey] == "true"
		})).
		Named(Name).
		Complete(rec)
}
