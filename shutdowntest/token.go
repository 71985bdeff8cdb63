package shutdowntest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/runnable"
)

// The objects the harness creates in the cluster for a token of its own
// (Options.MetricsToken): named by the API server after these prefixes (generateName),
// labelled CreatedByLabel=CreatedBy, deleted once the operator exited.
const (
	// CreatedByLabel and CreatedBy label every object the harness creates in a cluster, so
	// that what a killed test left can be found: kubectl delete
	// namespace,clusterrole,clusterrolebinding -l app.kubernetes.io/created-by=quiesce-shutdowntest
	CreatedByLabel = "app.kubernetes.io/created-by"
	CreatedBy      = "quiesce-shutdowntest"

	objectPrefix        = "shutdowntest-"
	readerPrefix        = "shutdowntest-metrics-reader-"
	tokenLifetimeSecond = 600 // TokenRequest's minimum; the ServiceAccount's deletion ends it sooner
	cleanupTimeout      = 30 * time.Second
	metricsCertDirName  = "metrics-certs"
)

// clusterObjects are what the harness created in the cluster, to delete in this order
// (access first), each only if it is still the object created (its UID).
type clusterObjects struct {
	cs      kubernetes.Interface
	binding *rbacv1.ClusterRoleBinding
	role    *rbacv1.ClusterRole
	sa      *corev1.ServiceAccount
	ns      *corev1.Namespace
}

// metricsToken returns the bearer token for the operator's metrics server: none for plain
// HTTP, else Options.MetricsToken, else a token of a ServiceAccount of the harness's own,
// made once (see Options.MetricsToken). It never returns the cluster credentials' own
// token: the metrics server is the operator's, not the API server.
func (o *Operator) metricsToken(ctx context.Context) (string, error) {
	if !o.opts.MetricsSecure {
		return "", nil
	}
	if o.opts.MetricsToken != "" {
		return o.opts.MetricsToken, nil
	}
	o.tokenMu.Lock()
	defer o.tokenMu.Unlock()
	if o.token != "" {
		return o.token, nil
	}
	if o.cleanedUp {
		return "", errors.New("failed to make a token for the secure metrics server: the operator exited, " +
			"and the harness deleted what it had created in the cluster")
	}
	cfg, err := clusterConfig(o.opts)
	if err != nil {
		return "", err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("failed to create a client: %w", err)
	}
	o.created = &clusterObjects{cs: cs}
	token, err := o.created.serviceAccountToken(ctx)
	if err != nil {
		return "", fmt.Errorf("failed to make a token for the secure metrics server (set Options.MetricsToken): %w", err)
	}
	o.token = token
	return token, nil
}

// clusterConfig returns the client configuration of opts's cluster: Env's (its admin),
// Config, or the kubeconfig's current context.
func clusterConfig(opts Options) (*rest.Config, error) {
	switch {
	case opts.Env != nil:
		return opts.Env.Config, nil
	case opts.Config != nil:
		return opts.Config, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("failed to load the kubeconfig %s: %w", opts.Kubeconfig, err)
	}
	return cfg, nil
}

// serviceAccountToken creates a namespace of the harness's own, a ServiceAccount in it, a
// ClusterRole allowed to GET the metrics server's paths bound to it, and returns a token of
// it. Each object is recorded as soon as it exists, so that a failure half-way leaves nothing
// that cleanup does not delete. All names are the API server's (generateName), so that no
// object of anyone else can be taken for the harness's.
func (c *clusterObjects) serviceAccountToken(ctx context.Context) (string, error) {
	meta := func(prefix, namespace string) metav1.ObjectMeta {
		return metav1.ObjectMeta{GenerateName: prefix, Namespace: namespace,
			Labels: map[string]string{CreatedByLabel: CreatedBy}}
	}
	var err error
	ns := &corev1.Namespace{ObjectMeta: meta(objectPrefix, "")}
	if c.ns, err = c.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		c.ns = nil
		return "", fmt.Errorf("failed to create a namespace: %w", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: meta("", c.ns.Name)}
	sa.Name = operatorUserName
	if c.sa, err = c.cs.CoreV1().ServiceAccounts(c.ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		c.sa = nil
		return "", fmt.Errorf("failed to create the ServiceAccount %s/%s: %w", c.ns.Name, sa.Name, err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: meta(readerPrefix, ""),
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics", runnable.DebugPath}, Verbs: []string{"get"}}},
	}
	if c.role, err = c.cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		c.role = nil
		return "", fmt.Errorf("failed to create a ClusterRole: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: meta(readerPrefix, ""),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: c.role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: c.sa.Name, Namespace: c.sa.Namespace}},
	}
	if c.binding, err = c.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		c.binding = nil
		return "", fmt.Errorf("failed to create a ClusterRoleBinding: %w", err)
	}
	tr, err := c.cs.CoreV1().ServiceAccounts(c.sa.Namespace).CreateToken(ctx, c.sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](tokenLifetimeSecond)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("failed to request a token of %s/%s: %w", c.sa.Namespace, c.sa.Name, err)
	}
	return tr.Status.Token, nil
}

// cleanUp deletes what metricsToken created, once the operator exited, and makes no more.
// It deletes each object only if it is still the one created (a UID precondition), and
// returns an error naming each it could not delete, with the command that deletes it.
func (o *Operator) cleanUp() error {
	o.tokenMu.Lock()
	defer o.tokenMu.Unlock()
	o.cleanedUp, o.token = true, "" // the token dies with its ServiceAccount
	c := o.created
	o.created = nil
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var errs []error
	del := func(kind, namespace string, obj metav1.Object, deleteFn func(string, metav1.DeleteOptions) error) {
		opts := metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(obj.GetUID()))}
		if err := deleteFn(obj.GetName(), opts); err != nil && !apierrors.IsNotFound(err) {
			cmd := "kubectl delete " + strings.ToLower(kind) + " " + obj.GetName()
			if namespace != "" {
				cmd = "kubectl -n " + namespace + " delete " + strings.ToLower(kind) + " " + obj.GetName()
			}
			errs = append(errs, fmt.Errorf("failed to delete the %s %s the harness created (%s): %w",
				kind, obj.GetName(), cmd, err))
		}
	}
	if c.binding != nil {
		del("ClusterRoleBinding", "", c.binding, func(name string, opts metav1.DeleteOptions) error {
			return c.cs.RbacV1().ClusterRoleBindings().Delete(ctx, name, opts)
		})
	}
	if c.role != nil {
		del("ClusterRole", "", c.role, func(name string, opts metav1.DeleteOptions) error {
			return c.cs.RbacV1().ClusterRoles().Delete(ctx, name, opts)
		})
	}
	if c.sa != nil {
		del("ServiceAccount", c.sa.Namespace, c.sa, func(name string, opts metav1.DeleteOptions) error {
			return c.cs.CoreV1().ServiceAccounts(c.sa.Namespace).Delete(ctx, name, opts)
		})
	}
	if c.ns != nil {
		del("Namespace", "", c.ns, func(name string, opts metav1.DeleteOptions) error {
			return c.cs.CoreV1().Namespaces().Delete(ctx, name, opts)
		})
	}
	return errors.Join(errs...)
}

// metricsCert writes, into dir, a serving certificate for the metrics server on 127.0.0.1
// (tls.crt, tls.key: what controller-runtime's metrics server and kubebuilder's
// --metrics-cert-path read), signed by a CA made for it alone, and returns the pool that
// trusts that CA.
func metricsCert(dir string) (*x509.CertPool, error) {
	cert, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)},
		[]string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("failed to make the metrics server's certificate: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create the metrics server's certificate directory: %w", err)
	}
	for name, data := range map[string][]byte{"tls.crt": cert, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("failed to write the metrics server's certificate: %w", err)
		}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cert) // the certificate, then its CA
	return pool, nil
}

// httpClient returns the client of the operator's servers: without keep-alives (no
// connection outlives a request); for HTTPS, trusting roots only (none: not verifying, as
// Options.MetricsInsecureSkipVerify asks); never following a redirect, which would carry the
// token elsewhere (a 3xx is returned as it is).
func httpClient(roots *x509.CertPool, insecure bool) *http.Client {
	t := &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
	}
	if insecure {
		t.TLSClientConfig.InsecureSkipVerify = true //nolint:gosec // asked for: Options.MetricsInsecureSkipVerify
	}
	return &http.Client{Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// certHint adds, to an error of a request to the metrics server that failed on its
// certificate, what to change.
func certHint(err error) error {
	var unknown x509.UnknownAuthorityError
	var hostname x509.HostnameError
	if !errors.As(err, &unknown) && !errors.As(err, &hostname) && !strings.Contains(err.Error(), "x509:") {
		return err
	}
	return fmt.Errorf("%w: the metrics server does not serve the certificate the harness gave it "+
		"(Endpoints.MetricsCertDir; KubebuilderFlags passes it as --metrics-cert-path): give it to the "+
		"metrics server (metricsserver.Options.CertDir), or set Options.MetricsInsecureSkipVerify", err)
}
