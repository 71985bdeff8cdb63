package controller_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quiesce-dev/quiesce/examples/config-operator/controller"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// publisherFunc is a Publisher made of a function.
type publisherFunc func(ctx context.Context, key client.ObjectKey, data map[string]string) error

func (f publisherFunc) Publish(ctx context.Context, key client.ObjectKey, data map[string]string) error {
	return f(ctx, key, data)
}

// An importer that does not use quiesce leaves Executor nil: SetupWithManager accepts it,
// and the reconciler, wrapped as SetupWithManager wraps it, runs untracked, its Publish
// call included, as it would without quiesce. No manager runs, no control plane.
func TestNilExecutorRunsUntracked(t *testing.T) {
	cm := newConfigMap("app")
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	var got map[string]string
	r := &controller.ConfigMapReconciler{Client: c, Publisher: publisherFunc(
		func(_ context.Context, _ client.ObjectKey, data map[string]string) error { got = data; return nil })}

	mgr, err := ctrl.NewManager(&rest.Config{Host: "http://127.0.0.1:1"}, ctrl.Options{ // never started
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)}, // the suite's manager has one too
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("SetupWithManager with a nil Executor = %v", err)
	}

	wrapped := reconcilers.Wrap(r.Executor, controller.Name, r, reconcilers.WrapOptions{})
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cm)}
	if _, err := wrapped.Reconcile(context.Background(), req); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if got["level"] != "info" {
		t.Fatalf("published %v, want the ConfigMap's data", got)
	}
	var after corev1.ConfigMap
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(cm), &after); err != nil {
		t.Fatal(err)
	}
	if rev := after.Annotations[controller.PublishedAnnotation]; rev != controller.Revision(cm.Data) {
		t.Fatalf("recorded revision %q, want %q", rev, controller.Revision(cm.Data))
	}
}
