package shutdowntest_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// A cluster given only as a kubeconfig file (standing in for kind's): the harness adds no
// user, the operator reconciles there.
func TestKubeconfigCluster(t *testing.T) {
	env, c := environment(t)
	g := NewWithT(t)
	user, err := env.AddUser(envtest.User{Name: "kind-admin", Groups: []string{mastersGroup}}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	path := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(writeFile(path, kc)).To(Succeed())
	wd, err := os.Getwd()
	g.Expect(err).NotTo(HaveOccurred())
	path, err = filepath.Rel(wd, path) // relative to the test's directory; the operator runs in ".."
	g.Expect(err).NotTo(HaveOccurred())

	opts := demoOptions(nil, "--grace-period=5s", "--work=500ms")
	opts.Kubeconfig = path
	op, err := shutdowntest.Start(t.Context(), opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	createConfigMaps(t.Context(), t, c, "kubeconfig", "job-1")
	g.Eventually(op.PendingCount).WithContext(t.Context()).WithTimeout(time.Minute).
		WithPolling(50 * time.Millisecond).Should(BeNumerically(">=", 1))
	res, err := op.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
}

// A cluster given as a rest.Config: here the control plane's admin configuration.
func TestConfigCluster(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	opts := demoOptions(nil)
	opts.Config = env.Config
	op, err := shutdowntest.Start(t.Context(), opts) // ready: its caches synced from the cluster
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	res, err := op.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
}

func TestOneCluster(t *testing.T) {
	g := NewWithT(t)
	for _, opts := range []shutdowntest.Options{
		{Binary: "/bin/true"},
		{Binary: "/bin/true", Env: &envtest.Environment{}, Kubeconfig: "kubeconfig"},
	} {
		_, err := shutdowntest.Start(t.Context(), opts)
		g.Expect(err).To(MatchError(ContainSubstring("set exactly one of Env, Config and Kubeconfig")))
	}
}

// A second control plane, given to the harness only as a kubeconfig file (as kind's would
// be): the operator's main package given as "." in its own directory, its metrics server on
// HTTPS with authentication; the harness reads its pending calls with a token it asks of
// that cluster through the kubeconfig's credentials, and stops it.
func TestSecondClusterByKubeconfigWithSecureMetrics(t *testing.T) {
	environment(t) // KUBEBUILDER_ASSETS checked; -short skips
	g := NewWithT(t)
	ctx := t.Context()
	kind := &envtest.Environment{}
	cfg, err := kind.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(kind.Stop()).To(Succeed()) })
	admin, err := kind.AddUser(envtest.User{Name: "kind-admin", Groups: []string{mastersGroup}}, cfg)
	g.Expect(err).NotTo(HaveOccurred())
	kc, err := admin.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	path, err := filepath.Abs(filepath.Join(t.TempDir(), "kubeconfig"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(writeFile(path, kc)).To(Succeed())
	c, err := client.New(cfg, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())

	op, err := shutdowntest.Start(ctx, shutdowntest.Options{
		Package: ".", Dir: secureOperator, Kubeconfig: path, MetricsSecure: true, Output: t.Output(),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kind"}})).To(Succeed())
	g.Expect(c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "job-1", Namespace: "kind", Labels: map[string]string{"secure": labelValue},
	}})).To(Succeed())
	g.Eventually(func() ([]shutdowntest.PendingCall, error) { return op.PendingCalls(ctx) }).WithContext(ctx).
		WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(ContainElement(HaveField("Name", "secure/kind/job-1/work")))
	res, err := op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
}
