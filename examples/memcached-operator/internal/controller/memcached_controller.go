/*
Copyright 2026.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package controller

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"

	cachev1alpha1 "example.com/memcached/api/v1alpha1"
)

// MemcachedReconciler reconciles a Memcached object
type MemcachedReconciler struct {
	client.Client
	Scheme *runtime.Scheme
	// Executor runs each reconcile, and the blocking calls in it, as tracked calls.
	Executor *drain.Executor
}

// +kubebuilder:rbac:groups=cache.example.com,resources=memcacheds,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cache.example.com,resources=memcacheds/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cache.example.com,resources=memcacheds/finalizers,verbs=update

// Reconcile is part of the main kubernetes reconciliation loop which aims to
// move the current state of the cluster closer to the desired state.
// TODO(user): Modify the Reconcile function to compare the state specified by
// the Memcached object against the actual cluster state, and then
// perform operations to make the cluster state reflect the state specified by
// the user.
//
// For more details, check Reconcile and its Result here:
// - https://pkg.go.dev/sigs.k8s.io/controller-runtime@v0.25.0/pkg/reconcile
func (r *MemcachedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)

	// Client calls honour ctx: call them directly.
	memcached := &cachev1alpha1.Memcached{}
	if err := r.Get(ctx, req.NamespacedName, memcached); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	// A call that blocks and ignores ctx runs as a tracked call: at shutdown quiesce waits for
	// it and names it if it hangs. fn may outlive Call (when ctx ends first), on its own
	// goroutine: hand it copies, not objects this reconcile goes on using.
	name := memcached.Name
	if err := reconcilers.Call(ctx, "register", func(context.Context) error {
		return register(name)
	}); err != nil {
		return ctrl.Result{}, fmt.Errorf("failed to register %s: %w", name, err)
	}
	log.Info("Registered")

	return ctrl.Result{}, nil
}

// register stands in for a call that blocks for a while and takes no context, such as a client
// library without contexts or an exec.Command's Run: replace it with yours.
func register(name string) error {
	time.Sleep(2 * time.Second)
	return nil
}

// SetupWithManager sets up the controller with the Manager.
func (r *MemcachedReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&cachev1alpha1.Memcached{}).
		Named("memcached").
		Complete(reconcilers.Wrap(r.Executor, "memcached", r, reconcilers.WrapOptions{})) // the name given to Named
}
