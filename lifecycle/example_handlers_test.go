package lifecycle_test

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/lifecycle"
)

// A reconciler of two handlers run one by one. In an operator, ex is the executor of a
// runnable.Runnable, c is mgr.GetClient(), the reconciler goes to
// ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Complete(r), and controller-runtime
// calls Reconcile until the handlers are done; here a loop does, on a fake client.
func ExampleHandlers() {
	ex := drain.New(drain.Options{})
	// With no deadline, Drain waits for every call and returns nil.
	defer func() { _ = ex.Drain(context.Background()) }()
	c := fake.NewClientBuilder().WithObjects(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "cfg", Generation: 1},
	}).Build()

	// Each handler runs as a tracked call: a drain waits for it and names it.
	handler := func(id string) lifecycle.Handler[*corev1.ConfigMap] {
		return lifecycle.Handler[*corev1.ConfigMap]{ID: id, Fn: func(context.Context, *corev1.ConfigMap) error {
			pending := ex.Pending()
			fmt.Println("running", pending[len(pending)-1].Name)
			return nil
		}}
	}
	r, err := lifecycle.Handlers(ex, c, "configmaps", nil,
		[]lifecycle.Handler[*corev1.ConfigMap]{handler("provision"), handler("notify")},
		lifecycle.HandlersOptions{
			Lifecycle: lifecycle.OneByOne,
			Clock:     clocktesting.NewFakePassiveClock(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)),
			// Everyone who may patch these ConfigMaps may also decide which handlers run: the
			// Record is not signed. Otherwise set ProgressKey (ExampleHandlersOptions_progressKey).
			UnsignedProgress: true,
		})
	if err != nil {
		fmt.Println(err)
		return
	}

	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "cfg"}}
	for {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			fmt.Println(err)
			return
		}
		if res.IsZero() { // all handlers done for this generation
			break
		}
	}

	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), req.NamespacedName, &cm); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cm.Annotations[lifecycle.DefaultProgressAnnotation])
	// Output:
	// running configmaps/default/cfg/provision
	// running configmaps/default/cfg/notify
	// {"generation":1,"handlers":{"notify":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"},"provision":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"}}}
}

// The progress annotation is JSON; ParseRecord reads it.
func ExampleParseRecord() {
	p, err := lifecycle.ParseRecord(`{"generation":2,"handlers":{"a":{"retries":0,"done":true},"b":{"retries":3,"done":false,"message":"failed to dial: timeout"}}}`)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Generation, p.Handlers["a"].Done, p.Handlers["b"].Retries, p.Handlers["b"].Message)

	_, err = lifecycle.ParseRecord(`{"generation":2,`)
	fmt.Println(err)
	// Output:
	// 2 true 3 failed to dial: timeout
	// failed to decode progress: unexpected end of JSON input
}

// With a ProgressKey, a Record that the operator did not sign (here written by someone who
// may patch the object, marking the handler done) is refused: the handler runs all the same,
// and a Warning Event says why.
func ExampleHandlersOptions_progressKey() {
	ex := drain.New(drain.Options{})
	defer func() { _ = ex.Drain(context.Background()) }()
	c := fake.NewClientBuilder().WithObjects(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace: metav1.NamespaceDefault, Name: "settings", Generation: 1, UID: "9b1f7c4e",
		Annotations: map[string]string{
			lifecycle.DefaultProgressAnnotation: `{"generation":1,"handlers":{"provision":{"retries":0,"done":true}}}`,
		},
	}}).Build()
	rec := events.NewFakeRecorder(10)
	provision := lifecycle.Handler[*corev1.ConfigMap]{ID: "provision", Fn: func(context.Context, *corev1.ConfigMap) error {
		fmt.Println("provisioning")
		return nil
	}}
	r, err := lifecycle.Handlers(ex, c, "configmaps", nil, []lifecycle.Handler[*corev1.ConfigMap]{provision},
		lifecycle.HandlersOptions{
			// In an operator: read from a Secret mounted for the operator alone.
			ProgressKey: []byte("0123456789abcdef0123456789abcdef"),
			Recorder:    rec,
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "settings"}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(<-rec.Events)
	// Output:
	// provisioning
	// Warning ProgressForged Annotation quiesce.dev/progress holds progress this operator did not sign, all handlers start afresh: failed to verify progress: no signature
}

// With StatusField, the Record is kept in the status subresource, here .status.progress of a
// custom resource (unstructured; a typed one needs the field in its Go type too): users who may
// edit the object but not its status can neither write it nor fill the annotations so that it
// cannot be saved. The fake client serves the status subresource as the API server does.
func ExampleHandlersOptions_statusField() {
	ex := drain.New(drain.Options{})
	defer func() { _ = ex.Drain(context.Background()) }()
	newWidget := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"})
		return u
	}
	w := newWidget()
	w.SetNamespace(metav1.NamespaceDefault)
	w.SetName("w")
	w.SetGeneration(1)
	c := fake.NewClientBuilder().WithObjects(w).WithStatusSubresource(w).Build()
	provision := lifecycle.Handler[*unstructured.Unstructured]{ID: "provision", Fn: func(context.Context, *unstructured.Unstructured) error {
		fmt.Println("provisioning")
		return nil
	}}
	r, err := lifecycle.Handlers(ex, c, "widgets", newWidget, []lifecycle.Handler[*unstructured.Unstructured]{provision},
		lifecycle.HandlersOptions{
			StatusField: "progress",
			Clock:       clocktesting.NewFakePassiveClock(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)),
			// Only the operator may patch widgets/status (see docs/security.md): the Record
			// needs no signature.
			UnsignedProgress: true,
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "w"}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		fmt.Println(err)
		return
	}
	got := newWidget()
	if err := c.Get(context.Background(), req.NamespacedName, got); err != nil {
		fmt.Println(err)
		return
	}
	progress, _, _ := unstructured.NestedString(got.Object, "status", "progress")
	fmt.Println(progress)
	fmt.Println(len(got.GetAnnotations()), "annotations")
	// Output:
	// provisioning
	// {"generation":1,"handlers":{"provision":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"}}}
	// 0 annotations
}
