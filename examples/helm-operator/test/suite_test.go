// Package test stops the helm-operator's real binary, on envtest, 3 s (scaled) into a Helm
// upgrade, with quiesce and as plain controller-runtime, and measures what each stop leaves:
// the release's state, the restarted operator's "another operation" errors, the stop's
// duration, and what quiesce logged. See ../README.md for the table and the scale.
package test

import (
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

var (
	testEnv   *envtest.Environment
	k8sClient client.Client
	// clientset reads Helm's records through Helm's storage (lastRelease).
	clientset kubernetes.Interface
	// operator is the helm-operator's binary, built once for the suite.
	operator string
)

func TestHelmOperator(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "helm-operator Suite")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	testEnv = &envtest.Environment{}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme.Scheme})
	Expect(err).NotTo(HaveOccurred())
	clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	// Each client's first request opens its connection, whose goroutines live as long as the
	// suite: open them here, before the specs' goroutine checks take their baseline.
	Expect(k8sClient.List(ctx, &corev1.NamespaceList{})).To(Succeed())
	_, err = clientset.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	// Without the race detector: under it Helm's every step is several times slower, and the
	// scaled cells leave it 1 s (5 s of the issue) for a 2 s rollback. A cold build compiles
	// Helm's dependencies: minutes.
	operator, err = shutdowntest.Build(ctx, shutdowntest.Options{Package: ".", Dir: "..", BuildFlags: []string{"-race=false"}})
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(20*time.Minute))

var _ = AfterSuite(func() {
	Expect(shutdowntest.Cleanup()).To(Succeed())
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})
