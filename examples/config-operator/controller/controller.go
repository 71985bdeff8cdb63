package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// Name is the controller's name, as given to the builder's Named and to reconcilers.Wrap.
const Name = "configmap-publisher"

// The label that selects the ConfigMaps to publish, and the annotation that records the
// revision (a hash of the data) published last.
const (
	PublishLabel        = "config-operator.quiesce.dev/publish"
	PublishedAnnotation = "config-operator.quiesce.dev/published"
)

// Publisher pushes a ConfigMap's data to the system the operator feeds. Publish blocks
// until that system answered; it should return when ctx ends.
type Publisher interface {
	Publish(ctx context.Context, key client.ObjectKey, data map[string]string) error
}

// ConfigMapReconciler publishes each labelled ConfigMap once per revision of its data.
type ConfigMapReconciler struct {
	client.Client
	Publisher Publisher
	// Executor tracks each reconcile and its Publish call (quiesce: q.Executor() of
	// runnable.Setup). nil: untracked, as without quiesce.
	Executor *drain.Executor
}

// Reconcile publishes the ConfigMap's data unless its revision was published already.
func (r *ConfigMapReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, req.NamespacedName, &cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	revision := Revision(cm.Data)
	if cm.Annotations[PublishedAnnotation] == revision {
		return ctrl.Result{}, nil
	}
	// quiesce: the blocking call, tracked as "configmap-publisher/<namespace>/<name>/publish".
	err := reconcilers.Call(ctx, "publish", func(ctx context.Context) error {
		return r.Publisher.Publish(ctx, req.NamespacedName, cm.Data)
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to publish: %w", err)
	}
	log.FromContext(ctx).Info("Published", "revision", revision)

	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[PublishedAnnotation] = revision
	if err := r.Patch(ctx, &cm, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to record the published revision: %w", err)
	}
	return ctrl.Result{}, nil
}

// Revision names a version of a ConfigMap's data: the first 16 hex digits of the SHA-256 of
// its JSON encoding (keys sorted).
func Revision(data map[string]string) string {
	b, _ := json.Marshal(data) // a map[string]string always encodes
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// SetupWithManager adds the reconciler to mgr as the controller Name.
func (r *ConfigMapReconciler) SetupWithManager(mgr ctrl.Manager) error {
	labelled := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[PublishLabel] == "true" })
	return ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}, builder.WithPredicates(labelled)).
		Named(Name).
		Complete(reconcilers.Wrap(r.Executor, Name, r, reconcilers.WrapOptions{})) // quiesce: track each reconcile
}
