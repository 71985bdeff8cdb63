//go:build realnode

package realnode_test

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/realnode"
)

// Names shared with examples/rollout/operator.
const (
	labelKey       = "quiesce.dev/rollout"
	doneAnnotation = "quiesce.dev/reconciled-by"
	validatePath   = "/validate-v1-configmap"
	appLabel       = "app"
	appName        = "operator"
)

// deployment is how one run deploys the operator.
type deployment struct {
	Namespace string
	Quiesce   bool
	Replicas  int32
	// The operator's flags; see examples/rollout/operator.
	Delay, Grace, Work time.Duration
	// Policy is --stop-policy (finish, cancel, handoff); empty: the operator's default.
	Policy string
	// TerminationGrace is the Pod's terminationGracePeriodSeconds.
	TerminationGrace int64
	// Bare runs one Pod of its own, named appName (no Deployment to replace it).
	Bare bool
}

func (d deployment) args() []string {
	args := []string{
		"--id=$(POD_NAME)", "--namespace=" + d.Namespace, "--cert-dir=/certs",
		"--quiesce=" + strconv.FormatBool(d.Quiesce), "--leader-elect=true",
		"--shutdown-delay=" + d.Delay.String(), "--grace-period=" + d.Grace.String(), "--work=" + d.Work.String(),
		"--max-concurrent-reconciles=50", "--health-probe-bind-address=:8081",
	}
	if d.Policy != "" {
		args = append(args, "--stop-policy="+d.Policy)
	}
	return args
}

// podSpec is the operator's Pod as kubebuilder's config/manager deploys one: its
// ServiceAccount, readiness on /readyz as the kubelet probes it, the webhook's certificate
// from a Secret.
func (d deployment) podSpec() corev1.PodSpec {
	return corev1.PodSpec{
		NodeName:                      realnode.NodeName, // no scheduler runs
		ServiceAccountName:            appName,
		TerminationGracePeriodSeconds: ptr.To(d.TerminationGrace),
		Containers: []corev1.Container{{
			Name:            appName,
			Image:           operatorImage,
			ImagePullPolicy: corev1.PullNever,
			Args:            d.args(),
			Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"},
			}}},
			Ports: []corev1.ContainerPort{{Name: "webhook", ContainerPort: 9443}, {Name: "probes", ContainerPort: 8081}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8081)}},
				PeriodSeconds: 1, FailureThreshold: 1,
			},
			VolumeMounts: []corev1.VolumeMount{{Name: "certs", MountPath: "/certs", ReadOnly: true}},
		}},
		Volumes: []corev1.Volume{{Name: "certs", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: "webhook-cert"},
		}}},
	}
}

// install creates the namespace, the operator's ServiceAccount and Role, the webhook's
// Secret, Service and ValidatingWebhookConfiguration (failurePolicy Fail, through the
// Service, this namespace only), then the operator: a Deployment (maxUnavailable 0, maxSurge
// 1) or a bare Pod. It returns when the operator's pods are Ready.
func (d deployment) install(ctx context.Context) {
	GinkgoHelper()
	ns := d.Namespace
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	DeferCleanup(func(ctx context.Context) error { return d.uninstall(ctx) })
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: appName}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: appName},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "patch", "update"}},
				{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update", "delete"}}, // delete: HandOffAtStop's claims
				{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: appName},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: appName, Namespace: ns}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: appName},
		}, metav1.CreateOptions{})
		return err
	})
	svcName := "webhook"
	crt, key, err := node.ServingCert(svcName+"."+ns+".svc", svcName+"."+ns+".svc.cluster.local")
	Expect(err).NotTo(HaveOccurred())
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "webhook-cert"},
			Data:       map[string][]byte{"tls.crt": crt, "tls.key": key},
		}, metav1.CreateOptions{})
		return err
	})
	labels := map[string]string{appLabel: appName}
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: svcName},
			Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{
				Port: 443, TargetPort: intstr.FromInt32(9443),
			}}},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx,
			&admissionregistrationv1.ValidatingWebhookConfiguration{
				ObjectMeta: metav1.ObjectMeta{Name: ns},
				Webhooks: []admissionregistrationv1.ValidatingWebhook{{
					Name: "configmaps.rollout.quiesce.dev",
					ClientConfig: admissionregistrationv1.WebhookClientConfig{
						Service:  &admissionregistrationv1.ServiceReference{Namespace: ns, Name: svcName, Path: ptr.To(validatePath)},
						CABundle: node.CA(),
					},
					Rules: []admissionregistrationv1.RuleWithOperations{{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
					}},
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
					ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
						Key: labelKey, Operator: metav1.LabelSelectorOpExists,
					}}},
					FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
					SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
					TimeoutSeconds:          ptr.To[int32](5),
					AdmissionReviewVersions: []string{"v1"},
				}},
			}, metav1.CreateOptions{})
		return err
	})
	if d.Bare {
		mustCreate(ctx, func(ctx context.Context) error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: appName, Labels: labels},
				Spec:       d.podSpec(),
			}, metav1.CreateOptions{})
			return err
		})
	} else {
		mustCreate(ctx, func(ctx context.Context) error {
			_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: appName},
				Spec: appsv1.DeploymentSpec{
					Replicas: ptr.To(d.Replicas),
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
						RollingUpdate: &appsv1.RollingUpdateDeployment{
							MaxUnavailable: ptr.To(intstr.FromInt32(0)), MaxSurge: ptr.To(intstr.FromInt32(1)),
						}},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: d.podSpec()},
				},
			}, metav1.CreateOptions{})
			return err
		})
	}
	want := int(d.Replicas)
	if d.Bare {
		want = 1
	}
	Eventually(func(ctx context.Context) (int, error) { return d.readyPods(ctx) }).WithContext(ctx).
		WithTimeout(2*time.Minute).Should(Equal(want), "the operator's pods never became Ready")
	// A Ready pod is not yet behind its Service: the EndpointSlice, then kube-proxy's rules
	// follow. Until then the API server's calls to the webhook are refused.
	Eventually(func(ctx context.Context) error {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, newConfigMap("webhook-reachable"), metav1.CreateOptions{})
		return err
	}).WithContext(ctx).Should(Succeed(), "the webhook never answered through its Service")
}

// readyPods counts the operator's pods whose Ready condition is True.
func (d deployment) readyPods(ctx context.Context) (int, error) {
	pods, err := cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: appLabel + "=" + appName})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			n++
		}
	}
	return n, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// uninstall deletes the webhook configuration and the namespace, and waits until the
// namespace is gone (its pods stopped), so that the next spec has the node to itself.
func (d deployment) uninstall(ctx context.Context) error {
	err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, d.Namespace, metav1.DeleteOptions{})
	if err := cs.CoreV1().Namespaces().Delete(ctx, d.Namespace, metav1.DeleteOptions{}); err != nil {
		return err
	}
	Eventually(func(ctx context.Context) bool {
		_, err := cs.CoreV1().Namespaces().Get(ctx, d.Namespace, metav1.GetOptions{})
		return err != nil
	}).WithContext(ctx).WithTimeout(2*time.Minute).Should(BeTrue(), "namespace %s was not deleted", d.Namespace)
	return err
}

// mustCreate creates an object, failing the spec on an error.
func mustCreate(ctx context.Context, create func(context.Context) error) {
	GinkgoHelper()
	Expect(create(ctx)).To(Succeed())
}

// newConfigMap is a labelled ConfigMap: the webhook validates its create, the operator
// reconciles it.
func newConfigMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{labelKey: "x"}}}
}

// unreconciled counts the labelled ConfigMaps of ns without the operator's done annotation,
// and those with it.
func unreconciled(ctx context.Context, ns string) (left, done int, err error) {
	l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: labelKey})
	if err != nil {
		return 0, 0, err
	}
	for _, cm := range l.Items {
		if _, ok := cm.Annotations[doneAnnotation]; ok {
			done++
		} else {
			left++
		}
	}
	return left, done, nil
}
