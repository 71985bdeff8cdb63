package suite_test

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// nestedOutcome is what the reconcile's handler call did once the stop began.
type nestedOutcome struct {
	ran      bool  // the handler ran
	err      error // the call's result
	exported bool  // its write is on the object
	startErr error // what mgr.Start returned
}

// stopMidCall runs, on a manager of its own in ns, a controller whose reconcile of "in-flight"
// waits until the manager's stop began and then makes one handler call that writes an
// annotation on the object: through reconcilers.Call, wrapped, on a quiesce manager; calling
// the function directly on plain controller-runtime. The stop begins for quiesce when its
// executor drains, for plain controller-runtime when it cancelled the reconcile's context.
func stopMidCall(ctx context.Context, ns string, withQuiesce bool) nestedOutcome {
	GinkgoHelper()
	var (
		mgr manager.Manager
		q   *runnable.Runnable
	)
	if withQuiesce {
		var err error
		mgr, q, err = newQuiesced(runnable.Options{CancelAfter: 10 * time.Second, GracePeriod: 15 * time.Second}, inNamespace(ns))
		Expect(err).NotTo(HaveOccurred())
	} else {
		mgr = newPlainManager(inNamespace(ns))
	}
	call := func(ctx context.Context, _ string, fn func(context.Context) error) error { return fn(ctx) }
	if withQuiesce {
		call = reconcilers.Call
	}

	started := make(chan context.Context, 1)
	stopBegan, beginStop := releaser()
	called := make(chan error, 1)
	var ran atomic.Bool
	var rec reconcile.Reconciler = reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		if req.Name != "in-flight" {
			return reconcile.Result{}, nil
		}
		select {
		case started <- ctx:
		default:
			return reconcile.Result{}, nil // once
		}
		<-stopBegan
		err := call(ctx, "export", func(ctx context.Context) error {
			ran.Store(true)
			var cm corev1.ConfigMap
			if err := mgr.GetClient().Get(ctx, req.NamespacedName, &cm); err != nil {
				return err
			}
			patch := client.MergeFrom(cm.DeepCopy())
			cm.Annotations = map[string]string{"quiesce.dev/exported": "done"}
			return mgr.GetClient().Patch(ctx, &cm, patch)
		})
		called <- err
		return reconcile.Result{}, err
	})
	if withQuiesce {
		rec = reconcilers.Wrap(q.Executor(), "nested", rec, reconcilers.WrapOptions{})
	}
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("nested").Complete(rec)).To(Succeed())
	stop, done := startManager(mgr)
	key := configMap(ctx, ns, "in-flight")

	var rctx context.Context
	Eventually(started, 20*time.Second).Should(Receive(&rctx))
	By("stopping the manager while the reconcile runs, before it makes its call")
	stop()
	if withQuiesce {
		Eventually(q.Executor().Draining(), 10*time.Second).Should(BeClosed())
		Expect(rctx.Err()).NotTo(HaveOccurred(), "the reconcile's context is live through the drain")
	} else {
		Eventually(rctx.Done(), 10*time.Second).Should(BeClosed())
	}
	beginStop()

	var o nestedOutcome
	Eventually(called, 20*time.Second).Should(Receive(&o.err))
	Eventually(done, 20*time.Second).Should(Receive(&o.startErr))
	o.ran = ran.Load()
	var cm corev1.ConfigMap
	Expect(k8sClient.Get(ctx, key, &cm)).To(Succeed())
	o.exported = cm.Annotations["quiesce.dev/exported"] == "done"
	if withQuiesce {
		Expect(q.Err()).NotTo(HaveOccurred())
		draintest.VerifyNone(GinkgoT(), q.Executor())
	}
	return o
}

var _ = Describe("reconcilers.Call in a reconcile in flight when the manager stops", func() {
	It("should run the call after the stop began, where plain controller-runtime cuts it", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()

		By("plain controller-runtime: the call runs with a cancelled context, its write fails")
		plain := stopMidCall(ctx, newNamespace(ctx), false)
		Expect(plain.ran).To(BeTrue())
		Expect(errors.Is(plain.err, context.Canceled)).To(BeTrue(), "plain's call failed with %v", plain.err)
		Expect(plain.exported).To(BeFalse())

		By("quiesce: the call is admitted by the drain and finishes its work")
		q := stopMidCall(ctx, newNamespace(ctx), true)
		Expect(q.err).NotTo(HaveOccurred(), "the call inside the in-flight reconcile was not refused")
		Expect(q.ran).To(BeTrue())
		Expect(q.exported).To(BeTrue(), "the call's write is on the object")
		Expect(q.startErr).NotTo(HaveOccurred())
		expectNoLeaks(cur)
	})
})
