// Command plain stands for an operator that has not adopted quiesce: a kubebuilder-like main
// with nothing of quiesce in it. Its controller "demo" reconciles the ConfigMaps labelled
// demo=quiesce as examples/demo-operator does: it works for --work (until its context ends,
// or regardless of it with --ignore-context), then records it in the annotation
// quiesce.dev/snapshot. The manager waits --graceful-shutdown-timeout for its runnables.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

const snapshotAnnotation = "quiesce.dev/snapshot"

func main() {
	var metricsAddr, probeAddr string
	var work, shutdownTimeout time.Duration
	var ignoreContext bool
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "")
	flag.StringVar(&probeAddr, "health-probe-bind-address", "0", "")
	flag.DurationVar(&work, "work", 3*time.Second, "How long each reconcile works.")
	flag.BoolVar(&ignoreContext, "ignore-context", false, "Work for --work even once the context ended.")
	flag.DurationVar(&shutdownTimeout, "graceful-shutdown-timeout", 30*time.Second, "")
	opts := zap.Options{Development: true}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		GracefulShutdownTimeout: &shutdownTimeout,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{"demo": "quiesce"})},
		}},
	})
	if err != nil {
		log.Error(err, "Failed to create manager")
		os.Exit(1)
	}
	c := mgr.GetClient()
	r := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, req.NamespacedName, &cm); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		if _, done := cm.Annotations[snapshotAnnotation]; done {
			return reconcile.Result{}, nil
		}
		t := time.NewTimer(work)
		defer t.Stop()
		if ignoreContext {
			<-t.C
		} else {
			select {
			case <-t.C:
			case <-ctx.Done():
				return reconcile.Result{}, fmt.Errorf("failed to take snapshot: %w", ctx.Err())
			}
		}
		patch := client.MergeFrom(cm.DeepCopy())
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[snapshotAnnotation] = time.Now().UTC().Format(time.RFC3339Nano)
		if err := c.Patch(ctx, &cm, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("failed to record the snapshot: %w", err)
		}
		return reconcile.Result{}, nil
	})
	err = ctrl.NewControllerManagedBy(mgr).Named("demo").
		For(&corev1.ConfigMap{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 10}).
		Complete(r)
	if err != nil {
		log.Error(err, "Failed to create controller")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Failed to add ready check")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "Problem running manager")
		os.Exit(1)
	}
}
