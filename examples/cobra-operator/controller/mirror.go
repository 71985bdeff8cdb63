package controller

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// Name is the controller's name, as given to the builder's Named and to reconcilers.Wrap.
const Name = "configmap-mirror"

// MirrorLabel selects the ConfigMaps to mirror; FieldOwner is the field manager of the
// mirrors' server-side applies.
const (
	MirrorLabel = "cobra-operator.quiesce.dev/mirror"
	FieldOwner  = "cobra-operator"
)

// MirrorName is the name of the mirror of the ConfigMap named name.
func MirrorName(name string) string { return name + "-mirror" }

// Mirror keeps, for each labelled ConfigMap, a ConfigMap MirrorName(name) in the same
// namespace holding the same data.
type Mirror struct {
	client.Client
	// Executor tracks each reconcile (quiesce: q.Executor() of runnable.Setup). nil:
	// untracked, as without quiesce.
	Executor *drain.Executor
}

// Reconcile applies the mirror of the ConfigMap: the same object every time for the same
// data, so that doing it twice is doing it once.
func (r *Mirror) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, req.NamespacedName, &cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	mirror := corev1ac.ConfigMap(MirrorName(cm.Name), cm.Namespace).
		WithLabels(map[string]string{"app.kubernetes.io/managed-by": FieldOwner}).
		WithData(cm.Data).
		WithOwnerReferences(ownerReference(&cm))
	if err := r.Apply(ctx, mirror, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to apply the mirror: %w", err)
	}
	return ctrl.Result{}, nil
}

func ownerReference(cm *corev1.ConfigMap) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().WithAPIVersion("v1").WithKind("ConfigMap").
		WithName(cm.Name).WithUID(cm.UID).WithController(true)
}

// SetupWithManager adds the reconciler to mgr as the controller Name, and the Validator
// as a validating webhook for ConfigMaps on mgr's webhook server (configured in code).
func (r *Mirror) SetupWithManager(mgr ctrl.Manager) error {
	labelled := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[MirrorLabel] == "true" })
	err := ctrl.NewControllerManagedBy(mgr).
		For(&corev1.ConfigMap{}, builder.WithPredicates(labelled)).
		Named(Name).
		// quiesce: track each reconcile; idempotent, so cancelled as the stop begins (docs/stop-policy.md)
		Complete(reconcilers.Wrap(r.Executor, Name, r, reconcilers.WrapOptions{Stop: reconcilers.CancelAtStop}))
	if err != nil {
		return err
	}
	return ctrl.NewWebhookManagedBy(mgr).For(&corev1.ConfigMap{}).WithValidator(Validator{}).Complete()
}

// Validator refuses a labelled ConfigMap whose mirror's name would not be a valid name.
type Validator struct{}

var _ admission.CustomValidator = Validator{}

// ValidateCreate checks the new ConfigMap.
func (Validator) ValidateCreate(_ context.Context, obj runtime.Object) (admission.Warnings, error) {
	return nil, validate(obj)
}

// ValidateUpdate checks the ConfigMap as updated.
func (Validator) ValidateUpdate(_ context.Context, _, obj runtime.Object) (admission.Warnings, error) {
	return nil, validate(obj)
}

// ValidateDelete allows every deletion.
func (Validator) ValidateDelete(context.Context, runtime.Object) (admission.Warnings, error) {
	return nil, nil
}

func validate(obj runtime.Object) error {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return apierrors.NewBadRequest(fmt.Sprintf("expected a ConfigMap, got %T", obj))
	}
	if cm.Labels[MirrorLabel] != "true" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(MirrorName(cm.Name)); len(errs) > 0 {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("ConfigMap").GroupKind(), cm.Name,
			field.ErrorList{field.Invalid(field.NewPath("metadata", "name"), cm.Name,
				"its mirror's name, "+MirrorName(cm.Name)+", would be invalid: "+strings.Join(errs, "; "))})
	}
	return nil
}
