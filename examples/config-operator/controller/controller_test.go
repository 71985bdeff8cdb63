package controller_test

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/quiesce-dev/quiesce/examples/config-operator/controller"
)

// newConfigMap returns a ConfigMap in "default", labelled for publishing, with level: info.
func newConfigMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default", Labels: map[string]string{controller.PublishLabel: "true"},
		},
		Data: map[string]string{"level": "info"},
	}
}

// published returns the revision recorded on the ConfigMap, for Eventually.
func published(ctx SpecContext, cm *corev1.ConfigMap) func() (string, error) {
	return func() (string, error) {
		var got corev1.ConfigMap
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), &got)
		return got.Annotations[controller.PublishedAnnotation], err
	}
}

var _ = Describe("ConfigMapReconciler", func() {
	It("should publish a labelled ConfigMap and record its revision", func(ctx SpecContext) {
		cm := newConfigMap("app-1")
		Expect(k8sClient.Create(ctx, cm)).To(Succeed())

		Eventually(published(ctx, cm)).Should(Equal(controller.Revision(cm.Data)))
		Expect(store.stored("default/app-1")).To(Equal(cm.Data))
	})

	It("should publish again when the data changes", func(ctx SpecContext) {
		cm := newConfigMap("app-2")
		Expect(k8sClient.Create(ctx, cm)).To(Succeed())
		Eventually(published(ctx, cm)).Should(Equal(controller.Revision(cm.Data)))

		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		cm.Data["level"] = "debug"
		Expect(k8sClient.Update(ctx, cm)).To(Succeed())
		Eventually(published(ctx, cm)).Should(Equal(controller.Revision(map[string]string{"level": "debug"})))
		Expect(store.stored("default/app-2")).To(HaveKeyWithValue("level", "debug"))
	})
})
