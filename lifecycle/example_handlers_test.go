package lifecycle_test

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
