package reconcilers_test

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// A wrapped reconcile is a tracked call named after the controller and the object.
func ExampleWrap() {
	ex := drain.New(drain.Options{}) // in an operator: q.Executor(), q from runnable.Add
	// With no deadline, Drain waits for every call and returns nil.
	defer func() { _ = ex.Drain(context.Background()) }()

	r := reconcilers.Wrap(ex, "memcached", reconcile.Func(
		func(context.Context, reconcile.Request) (reconcile.Result, error) {
			fmt.Println("tracked as", ex.Pending()[0].Name)
			return reconcile.Result{}, nil
		}), reconcilers.Options{})
	// In an operator: ctrl.NewControllerManagedBy(mgr).For(&v1.Memcached{}).Complete(r)
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "cache"}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		fmt.Println(err)
	}
	// Output: tracked as memcached/default/cache
}

// Blocking work inside a wrapped reconcile goes through Call: it is tracked, named, and
// waited for (and reported) at shutdown, even if the reconcile stops waiting for it.
func ExampleCall() {
	ex := drain.New(drain.Options{})
	// With no deadline, Drain waits for every call and returns nil.
	defer func() { _ = ex.Drain(context.Background()) }()

	r := reconcilers.Wrap(ex, "memcached", reconcile.Func(
		func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			err := reconcilers.Call(ctx, "backup", func(context.Context) error {
				fmt.Println("tracked as", ex.Pending()[1].Name)
				return nil // e.g. a blocking snapshot call, given fn's context
			})
			return reconcile.Result{}, err
		}), reconcilers.Options{})
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "cache"}}
	if _, err := r.Reconcile(context.Background(), req); err != nil {
		fmt.Println(err)
	}

	// Outside a wrapped reconcile, Call simply runs fn.
	_ = reconcilers.Call(context.Background(), "plain", func(context.Context) error {
		fmt.Println("pending outside:", len(ex.Pending()))
		return nil
	})
	// Output:
	// tracked as memcached/default/cache/backup
	// pending outside: 0
}
