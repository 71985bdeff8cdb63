package reconcilers_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// An Executor that drain.New did not create is refused when the controller is set up, with
// drain's message, not at its first reconcile with a nil dereference.
func TestSetupPanicsForExecutorNotCreatedByNew(t *testing.T) {
	noop := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	})
	setups := map[string]func(ex *drain.Executor){
		"Wrap": func(ex *drain.Executor) { reconcilers.Wrap(ex, "cms", noop, reconcilers.WrapOptions{}) },
		"WrapTyped": func(ex *drain.Executor) {
			reconcilers.WrapTyped[reconcile.Request](ex, "cms", noop, reconcilers.WrapOptions{})
		},
		"Wrap with a Recorder": func(ex *drain.Executor) {
			// A recorder and a reader that are never used: the setup panics first.
			reconcilers.Wrap(ex, "cms", noop, reconcilers.WrapOptions{
				Recorder: events.NewFakeRecorder(1), Reader: struct{ client.Reader }{}, Object: &corev1.ConfigMap{},
			})
		},
		"NewDaemons": func(ex *drain.Executor) { reconcilers.NewDaemons(ex, "cms", reconcilers.DaemonsOptions{}) },
	}
	for name, setup := range setups {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if v := recover(); v != internal.NotCreated {
					t.Fatalf("recover() = %v, want %q", v, internal.NotCreated)
				}
			}()
			setup(&drain.Executor{})
			t.Fatal("no panic")
		})
	}
}
