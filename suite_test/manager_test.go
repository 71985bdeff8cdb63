package suite_test

import (
	"context"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

var _ = Describe("A plain manager on the envtest control plane", func() {
	It("should reconcile a ConfigMap created through the API server and stop cleanly", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)

		var mu sync.Mutex
		seen := map[types.NamespacedName]int{}
		mgr := newManager(inNamespace(ns))
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("plain").
			Complete(reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
				mu.Lock()
				defer mu.Unlock()
				seen[req.NamespacedName]++
				return reconcile.Result{}, nil
			}))).To(Succeed())
		stop, done := startManager(mgr)

		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}}
		Expect(k8sClient.Create(ctx, cm)).To(Succeed())
		key := types.NamespacedName{Namespace: ns, Name: "plain"}
		Eventually(func() int {
			mu.Lock()
			defer mu.Unlock()
			return seen[key]
		}).Should(BeNumerically(">=", 1))

		stop()
		Eventually(done).Should(Receive(BeNil()), "mgr.Start returns nil")
		expectNoLeaks(cur)
	})
})
