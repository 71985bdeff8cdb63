package shutdowntest

import (
	"context"
	"fmt"
	"os"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/runnable"
)

// The objects the harness creates for a token of its own (Options.MetricsToken).
const (
	tokenNamespace      = "default"
	metricsReader       = "shutdowntest-metrics-reader"
	tokenLifetimeSecond = 3600
)

// metricsToken returns the bearer token for the operator's metrics server: none for plain
// HTTP, else Options.MetricsToken, the cluster credentials' own, or one made once (see
// Options.MetricsToken).
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
	cfg, err := clusterConfig(o.opts)
	if err != nil {
		return "", err
	}
	token, err := credentialsToken(cfg)
	if err == nil && token == "" {
		token, err = serviceAccountToken(ctx, cfg)
	}
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

// credentialsToken returns cfg's own bearer token, "" when it has none.
func credentialsToken(cfg *rest.Config) (string, error) {
	if cfg.BearerToken != "" || cfg.BearerTokenFile == "" {
		return cfg.BearerToken, nil
	}
	b, err := os.ReadFile(cfg.BearerTokenFile)
	if err != nil {
		return "", fmt.Errorf("failed to read the token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// serviceAccountToken creates (or finds) the harness's ServiceAccount, allowed to read the
// metrics server's paths, and returns a token of it.
func serviceAccountToken(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("failed to create a client: %w", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: operatorUserName, Namespace: tokenNamespace}}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: metricsReader},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics", runnable.DebugPath}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: metricsReader},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsReader},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}},
	}
	create := []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
	}
	for _, c := range create {
		if err := c(); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("failed to create the metrics reader: %w", err)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](tokenLifetimeSecond)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("failed to request a token: %w", err)
	}
	return tr.Status.Token, nil
}
