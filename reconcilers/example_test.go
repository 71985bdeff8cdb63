package reconcilers_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
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
		}), reconcilers.WrapOptions{})
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
		}), reconcilers.WrapOptions{})
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

// Options: requests that arrive once the executor drains are requeued after RequeueAfter,
// and a slow reconcile records a Warning Event on its object through Recorder.
func ExampleWrap_options() {
	ex := drain.New(drain.Options{SlowAfter: drain.MinSlowAfter})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "6e1f"}}
	// On controller-runtime v0.23 and later: mgr.GetEventRecorder("memcached"); on v0.22:
	// events.NewEventBroadcasterAdapter(clientset).NewRecorder("memcached").
	rec := events.NewFakeRecorder(1)
	release := make(chan struct{})
	r := reconcilers.Wrap(ex, "memcached", reconcile.Func(
		func(context.Context, reconcile.Request) (reconcile.Result, error) {
			<-release // a slow reconcile
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{
		RequeueAfter: 5 * time.Second,
		Recorder:     rec,
		Reader:       fake.NewClientBuilder().WithObjects(cm).Build(), // in an operator: mgr.GetClient()
		Object:       &corev1.ConfigMap{},
	})
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cm)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Reconcile(context.Background(), req)
	}()
	event := <-rec.Events // "Warning ReconcileSlow Reconcile running for ..."
	fmt.Println(strings.Join(strings.Fields(event)[:2], " "))
	close(release)
	<-done

	_ = ex.Drain(context.Background())
	res, err := r.Reconcile(context.Background(), req)
	fmt.Println("after the drain:", res.RequeueAfter, err)
	// Output:
	// Warning ReconcileSlow
	// after the drain: 5s <nil>
}

// shard is a typed request: a reconciler of shards, not of objects.
type shard struct{ ID int }

func (s shard) String() string { return fmt.Sprint("shard-", s.ID) }

// A typed reconciler is tracked like any other, its call named by the request's String.
func ExampleWrapTyped() {
	ex := drain.New(drain.Options{})
	defer func() { _ = ex.Drain(context.Background()) }()

	r := reconcilers.WrapTyped(ex, "shards", reconcile.TypedFunc[shard](
		func(context.Context, shard) (reconcile.Result, error) {
			fmt.Println("tracked as", ex.Pending()[0].Name)
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{RequeueAfter: 10 * time.Second})
	if _, err := r.Reconcile(context.Background(), shard{ID: 3}); err != nil {
		fmt.Println(err)
	}
	// Output: tracked as shards/shard-3
}
