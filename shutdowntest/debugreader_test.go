package shutdowntest_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// The example operator, a kubebuilder scaffold with secure metrics: its module, its main
// package, and the namespace of its manifests.
const (
	memcached          = "../examples/memcached-operator"
	memcachedMain      = "./cmd"
	memcachedNamespace = "memcached-system"
)

// applyFile creates every object of a YAML file, as `kubectl apply -f` does on a cluster
// that has none of them.
func applyFile(ctx context.Context, t *testing.T, c client.Client, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatalf("failed to decode %s: %v", path, err)
		}
		if err := c.Create(ctx, &u); err != nil {
			t.Fatalf("failed to create %s %s of %s: %v", u.GetKind(), u.GetName(), path, err)
		}
	}
}

// tokenOf returns a token of the ServiceAccount ns/name valid for ten minutes, requested
// as user: `kubectl -n ns create token name --duration=10m`.
func tokenOf(ctx context.Context, t *testing.T, user *envtest.AuthenticatedUser, ns, name string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(user.Config())
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("failed to create a token of %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// getStatus GETs url with token as bearer token, not verifying the server's certificate:
// `curl -sk -H "Authorization: Bearer ${token}" url`. It returns the status and the body.
func getStatus(ctx context.Context, url, token string) (int, []byte, error) {
	c := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // curl -k, as the recipe does
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// The recipe of docs/security.md, "Reading /debug/quiesce", against the example operator
// (examples/memcached-operator, metrics over HTTPS with kubebuilder's authentication and
// authorization filter): docs/rbac/quiesce-debug-reader.yaml applied as it is; a member of
// the group oncall creates a token of the quiesce-debug-reader ServiceAccount; the view
// answers it over HTTPS. A token bound to kubebuilder's metrics-reader role only (the
// scraper's) reads /metrics and is refused the view. The port-forward of the recipe is not
// exercised: envtest has no kubelet; the test reads the operator's loopback address instead.
func TestDebugViewReaderRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and builds an operator: skipped with -short")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	// The example is a module of its own: a -modfile in GOFLAGS (make test-latest's, for
	// quiesce's go.mod at the newest releases) is not its go.mod.
	var flags []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if !strings.HasPrefix(f, "-modfile=") {
			flags = append(flags, f)
		}
	}
	t.Setenv("GOFLAGS", strings.Join(flags, " "))
	g := NewWithT(t)
	ctx := t.Context()
	// A control plane of its own, with the example's CRD and webhook, as its own suite has.
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(memcached, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join(memcached, "config", "webhook")}},
	}
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { g.Expect(env.Stop()).To(Succeed()) })
	c, err := client.New(cfg, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())

	// kubectl create namespace memcached-system; kubectl apply -f docs/rbac/quiesce-debug-reader.yaml
	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: memcachedNamespace}})).To(Succeed())
	applyFile(ctx, t, c, "../docs/rbac/quiesce-debug-reader.yaml")
	// The scraper: a ServiceAccount bound to kubebuilder's metrics-reader, as Prometheus's is.
	applyFile(ctx, t, c, filepath.Join(memcached, "config", "rbac", "metrics_reader_role.yaml"))
	g.Expect(c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: memcachedNamespace, Name: "scraper"}})).
		To(Succeed())
	g.Expect(c.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "scraper-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: memcachedNamespace, Name: "scraper"}},
	})).To(Succeed())

	op, err := shutdowntest.Start(ctx, shutdowntest.Options{
		Package: memcachedMain, Dir: memcached, Env: env, MetricsSecure: true, Output: t.Output(),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	view := "https://" + op.Endpoints().Metrics + "/debug/quiesce?limit=all"
	metrics := "https://" + op.Endpoints().Metrics + "/metrics"

	// token="$(kubectl -n memcached-system create token quiesce-debug-reader --duration=10m)",
	// as a member of oncall.
	alice, err := env.AddUser(envtest.User{Name: "alice", Groups: []string{"oncall"}}, cfg)
	g.Expect(err).NotTo(HaveOccurred())
	reader := tokenOf(ctx, t, alice, memcachedNamespace, "quiesce-debug-reader")
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{mastersGroup}}, cfg)
	g.Expect(err).NotTo(HaveOccurred())
	scraper := tokenOf(ctx, t, admin, memcachedNamespace, "scraper")

	// curl -sk -H "Authorization: Bearer ${token}" "https://localhost:8443/debug/quiesce?limit=all",
	// once the metrics server listens (it starts after /readyz answers).
	var body []byte
	g.Eventually(func() (int, error) {
		status, b, err := getStatus(ctx, view, reader)
		body = b
		return status, err
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).
		Should(Equal(http.StatusOK), "the reader's token")
	var state struct {
		Count *int `json:"count"`
	}
	g.Expect(json.Unmarshal(body, &state)).To(Succeed(), "%s", body)
	g.Expect(state.Count).NotTo(BeNil(), "%s", body)

	for _, tc := range []struct {
		what, url, token string
		want             int
	}{
		{"the scraper's token, on the view", view, scraper, http.StatusForbidden},
		{"the scraper's token, on /metrics", metrics, scraper, http.StatusOK},
		{"the reader's token, on /metrics", metrics, reader, http.StatusForbidden},
		{"no token, on the view", view, "", http.StatusUnauthorized},
	} {
		status, body, err := getStatus(ctx, tc.url, tc.token)
		g.Expect(err).NotTo(HaveOccurred(), tc.what)
		g.Expect(status).To(Equal(tc.want), "%s: %.200s", tc.what, body)
	}

	res, err := op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
}
