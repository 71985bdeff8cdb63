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
	// A cold build compiles Helm's dependencies (with -race under go test -race): minutes.
	operator, err = shutdowntest.Build(ctx, shutdowntest.Options{Package: ".", Dir: ".."})
	Expect(err).NotTo(HaveOccurred())
}, NodeTimeout(20*time.Minute))

var _ = AfterSuite(func() {
	Expect(shutdowntest.Cleanup()).To(Succeed())
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})
