package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// SnapshotAnnotation records when the snapshot handler finished for a ConfigMap.
const SnapshotAnnotation = "quiesce.dev/snapshot"

// ConfigMapReconciler runs one handler per labelled ConfigMap: "snapshot", or
// "legacy-export" for the ConfigMaps whose name starts with "hang". The ConfigMaps whose name
// starts with "watch" get instead a daemon, "heartbeat", for as long as they exist.
type ConfigMapReconciler struct {
	client.Client
	// Work is how long the snapshot handler takes.
	Work time.Duration
	// Heartbeat is the interval of the heartbeat daemon's log line; 0: 2s.
	Heartbeat time.Duration

	daemons *reconcilers.Daemons // made by SetupWithManager
}

// Reconcile runs the ConfigMap's handler once, then records it in SnapshotAnnotation.
func (r *ConfigMapReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var cm corev1.ConfigMap
	if err := r.Get(ctx, req.NamespacedName, &cm); err != nil {
		if apierrors.IsNotFound(err) && strings.HasPrefix(req.Name, "watch") {
			// quiesce: the ConfigMap is gone: stop its daemon, waiting up to the stop timeout.
			_, err = r.daemons.Stop(ctx, req.NamespacedName, "heartbeat")
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if strings.HasPrefix(cm.Name, "watch") {
		// quiesce: one daemon per ConfigMap, "demo/<namespace>/<name>/heartbeat", started once
		// (Ensure is idempotent), stopped when the ConfigMap goes or the operator stops.
		return ctrl.Result{}, r.daemons.Ensure(ctx, &cm, "heartbeat", r.heartbeat)
	}
	if _, done := cm.Annotations[SnapshotAnnotation]; done {
		return ctrl.Result{}, nil
	}

	handler, fn := "snapshot", r.snapshot
	if strings.HasPrefix(cm.Name, "hang") {
		handler, fn = "legacy-export", func(context.Context) error { return exportClient.Export(cm.Name) }
	}
	logger = logger.WithValues("handler", handler)
	start := time.Now()
	// quiesce: a tracked call "demo/<namespace>/<name>/<handler>"; it says so once admitted.
	started := func(ctx context.Context) error { logger.Info("Handler started"); return fn(ctx) }
	err := reconcilers.Call(ctx, handler, started)
	took := time.Since(start).Round(time.Millisecond).String()
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			// The drain cancelled our context; a handler that ignores it still runs, and the
			// executor still tracks it.
			logger.Info("Stopped waiting for handler: its context ended", "took", took)
		}
		return ctrl.Result{}, fmt.Errorf("failed to run handler %s: %w", handler, err)
	}
	logger.Info("Handler finished", "took", took)

	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[SnapshotAnnotation] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := r.Patch(ctx, &cm, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to record the snapshot: %w", err)
	}
	return ctrl.Result{}, nil
}

// snapshot works for r.Work, or until ctx ends.
func (r *ConfigMapReconciler) snapshot(ctx context.Context) error {
	t := time.NewTimer(r.Work)
	defer t.Stop()
	select { // the snapshot works here
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("failed to take snapshot: %w", ctx.Err())
	}
}

// heartbeat is a daemon: it logs a line every r.Heartbeat until its context ends.
func (r *ConfigMapReconciler) heartbeat(ctx context.Context) error {
	logger := log.FromContext(ctx) // carries controller, namespace, name and daemon
	every := r.Heartbeat
	if every <= 0 {
		every = 2 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for beats := 1; ; beats++ {
		select {
		case <-ctx.Done():
			logger.Info("Heartbeat stopped", "beats", beats-1)
			return nil
		case <-t.C:
			logger.Info("Heartbeat", "beats", beats)
		}
	}
}

// legacyClient stands for an SDK whose calls take no context and have no timeout: a call
// to a server that never answers blocks forever, and nothing can cancel it.
type legacyClient struct {
	replies chan error // nobody ever sends
}

var exportClient = &legacyClient{replies: make(chan error)}

// Export blocks until the server replies.
func (c *legacyClient) Export(_ string) error {
	return <-c.replies // blocks here: the server never replies
}

// SetupWithManager adds the reconciler to mgr as the controller "demo", each reconcile a
// tracked call of ex, with up to workers reconciles at once: a hanging handler holds one
// until its context ends.
func (r *ConfigMapReconciler) SetupWithManager(mgr ctrl.Manager, ex *drain.Executor, workers int) error {
	r.daemons = reconcilers.NewDaemons(ex, "demo", reconcilers.DaemonsOptions{}) // quiesce: per-object daemons
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}).
		Named("demo").
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(reconcilers.Wrap(ex, "demo", r, reconcilers.WrapOptions{})) // quiesce: track each reconcile
}
