package shutdowntest_test

import (
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// kubeconfigToken stands for the bearer token of a kubeconfig (an admin's, say): envtest's API
// server authenticates the client certificate beside it, and the harness must send it nowhere
// but there.
const kubeconfigToken = "kubeconfig-admin-token"

// metricsRecorder stands for a secure metrics server, listening where the harness told the
// operator to serve metrics: it records the Authorization header of each request it gets.
type metricsRecorder struct {
	mu   sync.Mutex
	auth []string
}

func (m *metricsRecorder) headers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.auth...)
}

// serve starts the recorder on addr, serving certs (none: httptest's own certificate).
func (m *metricsRecorder) serve(t *testing.T, addr string, certs []tls.Certificate) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.auth = append(m.auth, r.Header.Get("Authorization"))
		m.mu.Unlock()
		_, _ = w.Write([]byte(`{"count": 0, "calls": []}`))
	}))
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: certs, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes refused on purpose
	srv.StartTLS()
	t.Cleanup(srv.Close)
}

// recordedOptions run testdata/forker (which never calls the API server: every request to
// it is the harness's) against cfg with MetricsSecure, its metrics server the recorder,
// serving the certificate the harness made for it unless ownCert is set.
func recordedOptions(t *testing.T, cfg *rest.Config, rec *metricsRecorder, ownCert bool) shutdowntest.Options {
	opts := forkerOptions(nil)
	opts.Env, opts.Config, opts.MetricsSecure, opts.Output = nil, cfg, true, t.Output()
	opts.Flags = func(e shutdowntest.Endpoints) []string {
		var certs []tls.Certificate
		if !ownCert {
			cert, err := tls.LoadX509KeyPair(filepath.Join(e.MetricsCertDir, "tls.crt"), filepath.Join(e.MetricsCertDir, "tls.key"))
			if err != nil {
				t.Fatal(err)
			}
			certs = []tls.Certificate{cert}
		}
		rec.serve(t, e.Metrics, certs)
		return []string{"--health-probe-bind-address=" + e.Probe}
	}
	return opts
}

// adminWithToken is the control plane's admin configuration with a bearer token beside its
// client certificate.
func adminWithToken(t *testing.T) (*rest.Config, kubernetes.Interface) {
	env, _ := environment(t)
	cfg := rest.CopyConfig(env.Config)
	cfg.BearerToken = kubeconfigToken
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, cs
}

// reviewToken returns the user the API server authenticates token as, "" when it does not.
func reviewToken(t *testing.T, cs kubernetes.Interface, token string) string {
	t.Helper()
	tr, err := cs.AuthenticationV1().TokenReviews().Create(t.Context(),
		&authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Status.Authenticated {
		return ""
	}
	return tr.Status.User.Username
}

// The harness sends the metrics server a token of a ServiceAccount of its own, in a namespace
// of its own, never the kubeconfig's; it deletes all it created once the operator exited,
// and the token dies with them.
func TestMetricsTokenOfItsOwn(t *testing.T) {
	cfg, cs := adminWithToken(t)
	g := NewWithT(t)
	ctx := t.Context()
	var rec metricsRecorder
	op, err := shutdowntest.Start(ctx, recordedOptions(t, cfg, &rec, false))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	g.Expect(op.PendingCount(ctx)).To(Equal(0))
	g.Expect(rec.headers()).To(HaveLen(1))
	token, ok := strings.CutPrefix(rec.headers()[0], "Bearer ")
	g.Expect(ok).To(BeTrue())
	g.Expect(token).NotTo(Equal(kubeconfigToken))
	user := reviewToken(t, cs, token)
	m := regexp.MustCompile(`^system:serviceaccount:(shutdowntest-[a-z0-9]+):shutdowntest$`).FindStringSubmatch(user)
	g.Expect(m).To(HaveLen(2), "the token's user: %q", user)
	ns := m[1]
	g.Expect(op.PendingCount(ctx)).To(Equal(0)) // the same token, made once
	g.Expect(rec.headers()).To(HaveExactElements(rec.headers()[0], rec.headers()[0]))

	// What it created: labelled, bound to its ServiceAccount alone.
	created := metav1.ListOptions{LabelSelector: shutdowntest.CreatedByLabel + "=" + shutdowntest.CreatedBy}
	bindings, err := cs.RbacV1().ClusterRoleBindings().List(ctx, created)
	g.Expect(err).NotTo(HaveOccurred())
	var binding *rbacv1.ClusterRoleBinding
	for i, b := range bindings.Items {
		if len(b.Subjects) == 1 && b.Subjects[0].Namespace == ns {
			binding = &bindings.Items[i]
		}
	}
	g.Expect(binding).NotTo(BeNil())
	g.Expect(binding.Subjects).To(ConsistOf(HaveField("Name", "shutdowntest")))
	role := binding.RoleRef.Name
	g.Expect(cs.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})).
		To(HaveField("ObjectMeta.Labels", HaveKeyWithValue(shutdowntest.CreatedByLabel, shutdowntest.CreatedBy)))

	res, err := op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	_, err = cs.CoreV1().ServiceAccounts(ns).Get(ctx, "shutdowntest", metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ServiceAccount: %v", err)
	_, err = cs.RbacV1().ClusterRoleBindings().Get(ctx, binding.Name, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ClusterRoleBinding: %v", err)
	_, err = cs.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ClusterRole: %v", err)
	// envtest runs no namespace controller: a deleted namespace stays, terminating.
	nsObj, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err) || (err == nil && nsObj.DeletionTimestamp != nil)).To(BeTrue(),
		"the namespace: %v", err)
	// The API server's token authenticator reads ServiceAccounts from its cache: soon.
	g.Eventually(func() string { return reviewToken(t, cs, token) }).WithContext(ctx).WithTimeout(30*time.Second).
		WithPolling(50*time.Millisecond).Should(BeEmpty(), "the token outlived its ServiceAccount")
	// Nothing is made again once the operator exited.
	_, err = op.PendingCount(ctx)
	g.Expect(err).To(MatchError(ContainSubstring("the operator exited")))
	g.Expect(rec.headers()).To(HaveLen(2))
}

// A metrics server that does not prove it holds the certificate the harness gave the
// operator gets no request, hence no token; with MetricsInsecureSkipVerify it gets one, the
// harness's ServiceAccount's, never the kubeconfig's.
func TestMetricsServerCertificateVerified(t *testing.T) {
	cfg, cs := adminWithToken(t)
	g := NewWithT(t)
	ctx := t.Context()
	var rec metricsRecorder
	op, err := shutdowntest.Start(ctx, recordedOptions(t, cfg, &rec, true))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	_, err = op.PendingCount(ctx)
	g.Expect(err).To(MatchError(And(ContainSubstring("x509"),
		ContainSubstring("does not serve the certificate the harness gave it"),
		ContainSubstring("Options.MetricsInsecureSkipVerify"))))
	g.Expect(rec.headers()).To(BeEmpty())
	res, err := op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())

	var insecure metricsRecorder
	opts := recordedOptions(t, cfg, &insecure, true)
	opts.MetricsInsecureSkipVerify = true
	op, err = shutdowntest.Start(ctx, opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	g.Expect(op.PendingCount(ctx)).To(Equal(0))
	g.Expect(insecure.headers()).To(HaveLen(1))
	token, _ := strings.CutPrefix(insecure.headers()[0], "Bearer ")
	g.Expect(token).NotTo(Equal(kubeconfigToken))
	g.Expect(reviewToken(t, cs, token)).To(HavePrefix("system:serviceaccount:shutdowntest-"))
	_, err = op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
}

// startRecorded starts the harness with its metrics requests recorded, once it has served
// one, and returns it with the namespace of the ServiceAccount whose token it sent.
func startRecorded(t *testing.T) (cs kubernetes.Interface, op *shutdowntest.Operator, ns string) {
	cfg, cs := adminWithToken(t)
	g := NewWithT(t)
	var rec metricsRecorder
	op, err := shutdowntest.Start(t.Context(), recordedOptions(t, cfg, &rec, false))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	g.Expect(op.PendingCount(t.Context())).To(Equal(0))
	token, _ := strings.CutPrefix(rec.headers()[0], "Bearer ")
	return cs, op, strings.Split(reviewToken(t, cs, token), ":")[2]
}

// An object the harness created, replaced meanwhile by another of the same name, is not
// deleted, and Stop says so, with the command that deletes it; the others are deleted.
func TestCleanupFailureIsReported(t *testing.T) {
	cs, op, ns := startRecorded(t)
	g := NewWithT(t)
	ctx := t.Context()

	bindings, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{
		LabelSelector: shutdowntest.CreatedByLabel + "=" + shutdowntest.CreatedBy})
	g.Expect(err).NotTo(HaveOccurred())
	var role, binding string
	for _, b := range bindings.Items {
		if b.Subjects[0].Namespace == ns {
			role, binding = b.RoleRef.Name, b.Name
		}
	}
	g.Expect(role).NotTo(BeEmpty())
	g.Expect(cs.RbacV1().ClusterRoles().Delete(ctx, role, metav1.DeleteOptions{})).To(Succeed())
	impostor, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}},
		metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(ctx, role, metav1.DeleteOptions{}) })

	_, err = op.Stop(ctx)
	g.Expect(err).To(MatchError(And(
		ContainSubstring("failed to delete the ClusterRole "+role+" the harness created (kubectl delete clusterrole "+role+")"),
		ContainSubstring("the UID in the precondition"))))
	g.Expect(cs.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})).To(HaveField("UID", impostor.UID))
	_, err = cs.RbacV1().ClusterRoleBindings().Get(ctx, binding, metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ClusterRoleBinding: %v", err)
	_, err = cs.CoreV1().ServiceAccounts(ns).Get(ctx, "shutdowntest", metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ServiceAccount: %v", err)
}

// Kill, too, deletes what the harness created (here the ServiceAccount, whose deletion ends
// the token).
func TestKillDeletesWhatItCreated(t *testing.T) {
	cs, op, ns := startRecorded(t)
	g := NewWithT(t)
	ctx := t.Context()
	g.Expect(cs.CoreV1().ServiceAccounts(ns).Get(ctx, "shutdowntest", metav1.GetOptions{})).NotTo(BeNil())

	op.Kill()
	_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "shutdowntest", metav1.GetOptions{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the ServiceAccount: %v", err)
}
