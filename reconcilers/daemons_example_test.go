package reconcilers_test

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// heartbeatFinalizer keeps a ConfigMap until its daemon stopped.
const heartbeatFinalizer = "example.com/heartbeat"

// HeartbeatReconciler runs the daemon "heartbeat" for each ConfigMap while it exists.
type HeartbeatReconciler struct {
	client.Client
	Daemons *reconcilers.Daemons
	started chan struct{}
}

func (r *HeartbeatReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, req.NamespacedName, &cm); err != nil {
		if apierrors.IsNotFound(err) { // gone without our finalizer: stop its daemon anyway
			_, err = r.Daemons.Stop(ctx, req.NamespacedName, "heartbeat")
		}
		return reconcile.Result{}, err
	}
	if !cm.DeletionTimestamp.IsZero() {
		// Release the finalizer only once the daemon stopped; if it still runs after the
		// stop timeout, ask again later.
		stopped, err := r.Daemons.Stop(ctx, req.NamespacedName, "heartbeat")
		if err != nil || !stopped {
			return reconcile.Result{RequeueAfter: time.Second}, err
		}
		if controllerutil.RemoveFinalizer(&cm, heartbeatFinalizer) {
			return reconcile.Result{}, r.Update(ctx, &cm)
		}
		return reconcile.Result{}, nil
	}
	if controllerutil.AddFinalizer(&cm, heartbeatFinalizer) {
		if err := r.Update(ctx, &cm); err != nil {
			return reconcile.Result{}, err
		}
	}
	// Idempotent: on every reconcile. After the drain began, the error requeues quietly.
	return reconcile.Result{}, r.Daemons.Ensure(ctx, &cm, "heartbeat", r.heartbeat)
}

// heartbeat would, say, poll an external system for the ConfigMap until its context ends.
func (r *HeartbeatReconciler) heartbeat(ctx context.Context) error {
	fmt.Println("heartbeat started")
	close(r.started)
	<-ctx.Done()
	fmt.Println("heartbeat stopped")
	return nil
}

// A daemon runs for as long as its object exists; the finalizer is released only after the
// daemon stopped.
func ExampleNewDaemons() {
	ex := drain.New(drain.Options{}) // in an operator: q.Executor(), q from runnable.Add
	defer func() { _ = ex.Drain(context.Background()) }()

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "6e1f"}}
	c := fake.NewClientBuilder().WithObjects(cm).Build()
	r := &HeartbeatReconciler{
		Client:  c,
		Daemons: reconcilers.NewDaemons(ex, "heartbeat", reconcilers.DaemonsOptions{}),
		started: make(chan struct{}),
	}
	// In an operator: ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).
	//	Complete(reconcilers.Wrap(q.Executor(), "heartbeat", r, reconcilers.WrapOptions{}))
	w := reconcilers.Wrap(ex, "heartbeat", r, reconcilers.WrapOptions{})
	ctx := context.Background()
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(cm)}

	if _, err := w.Reconcile(ctx, req); err != nil {
		fmt.Println(err)
	}
	<-r.started
	fmt.Println("tracked as", ex.Pending()[0].Name)

	// Deleting it sets its deletion timestamp; the finalizer keeps it.
	if err := c.Delete(ctx, cm); err != nil {
		fmt.Println(err)
	}
	if _, err := w.Reconcile(ctx, req); err != nil {
		fmt.Println(err)
	}
	err := c.Get(ctx, req.NamespacedName, &corev1.ConfigMap{})
	fmt.Println("object gone:", apierrors.IsNotFound(err), "daemons running:", r.Daemons.Stats().Running)
	// Output:
	// heartbeat started
	// tracked as heartbeat/default/web/heartbeat
	// heartbeat stopped
	// object gone: true daemons running: 0
}
