package main

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Reconciler reconciles a labelled ConfigMap once: it works for Work, then writes its ID in
// DoneAnnotation. That write is an UPDATE of a labelled ConfigMap: the operator's own
// validating webhook validates it, as it validates the creates.
type Reconciler struct {
	client.Client
	ID   string
	Work time.Duration
}

// Reconcile logs "Reconcile ended" with its start and end, whatever happens: the runner
// reads these lines to check that two replicas never reconcile at once.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	start := time.Now()
	worked, err := r.reconcile(ctx, req)
	log.FromContext(ctx).Info("Reconcile ended", "start", start.Format(time.RFC3339Nano),
		"end", time.Now().Format(time.RFC3339Nano), "worked", worked, "done", worked && err == nil, "error", errString(err))
	return ctrl.Result{}, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (worked bool, err error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, req.NamespacedName, &cm); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if _, done := cm.Annotations[DoneAnnotation]; done {
		return false, nil
	}
	// The work: it stops when its context ends. The line says that a reconcile is in flight.
	log.FromContext(ctx).Info("Reconcile working")
	t := time.NewTimer(r.Work)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return true, ctx.Err()
	}
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[DoneAnnotation] = r.ID
	return true, r.Patch(ctx, &cm, patch)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

var decoder = admission.NewDecoder(scheme.Scheme)

// validator admits every ConfigMap that has the label LabelKey (the webhook configuration
// selects those only) after working for work, as a webhook that looks something up; it
// denies the others.
//
// With ownWrites (--self-write) it also validates the reconciles' own writes: an UPDATE that
// adds DoneAnnotation must name a replica (a non-empty value), and each one it admits is
// logged, "Admitted own write", so that the runner can tell when this replica's webhook
// admitted the writes of its reconciles (during the drain, in the single-replica case).
type validator struct {
	work      time.Duration
	ownWrites bool
	log       logr.Logger
}

func (v *validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	t := time.NewTimer(v.work)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return admission.Errored(http.StatusServiceUnavailable, ctx.Err())
	}
	var cm corev1.ConfigMap
	if err := decoder.Decode(req, &cm); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if _, ok := cm.Labels[LabelKey]; !ok {
		return admission.Denied("the ConfigMap has no label " + LabelKey)
	}
	if v.ownWrites && req.Operation == admissionv1.Update {
		return v.ownWrite(req, &cm)
	}
	return admission.Allowed("")
}

// ownWrite validates an UPDATE of cm: one that adds DoneAnnotation is a reconcile's write.
func (v *validator) ownWrite(req admission.Request, cm *corev1.ConfigMap) admission.Response {
	by, done := cm.Annotations[DoneAnnotation]
	if !done {
		return admission.Allowed("")
	}
	var old corev1.ConfigMap
	if err := decoder.DecodeRaw(req.OldObject, &old); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if _, was := old.Annotations[DoneAnnotation]; was {
		return admission.Allowed("")
	}
	if by == "" {
		return admission.Denied("annotation " + DoneAnnotation + " must name the replica that reconciled the ConfigMap")
	}
	v.log.Info("Admitted own write", "namespace", req.Namespace, "name", req.Name, "reconciledBy", by)
	return admission.Allowed("")
}

// mustExists is the requirement "the label key exists"; it panics on an invalid key.
func mustExists(key string) labels.Requirement {
	req, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return *req
}
