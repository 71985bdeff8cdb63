package suite_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// applyDoc creates the objects of a YAML file of the docs, the namespace memcached-system
// replaced by ns; they are deleted when the spec ends.
func applyDoc(ctx context.Context, path, ns string) {
	GinkgoHelper()
	data, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var u unstructured.Unstructured
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return
		}
		Expect(err).NotTo(HaveOccurred())
		if u.GetNamespace() != "" {
			u.SetNamespace(ns)
		}
		if subjects, ok := u.Object["subjects"].([]any); ok {
			for _, s := range subjects {
				if m := s.(map[string]any); m["namespace"] != nil {
					m["namespace"] = ns
				}
			}
		}
		Expect(k8sClient.Create(ctx, &u)).To(Succeed(), "creating %s %s", u.GetKind(), u.GetName())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, &u))).To(Succeed()) })
	}
}

// allowed asks the API server, as the metrics server's filter does, whether user may GET the
// non-resource path.
func allowed(ctx context.Context, user string, groups []string, path string) bool {
	GinkgoHelper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}
	Expect(k8sClient.Create(ctx, sar)).To(Succeed())
	return sar.Status.Allowed
}

var _ = Describe("The quiesce-debug-reader RBAC of docs/security.md", func() {
	It("should let people read /debug/quiesce with a token of its ServiceAccount, and nothing more", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		applyDoc(ctx, "../docs/rbac/quiesce-debug-reader.yaml", ns)

		By("letting a member of the group create a token of quiesce-debug-reader, of no other ServiceAccount")
		Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "controller-manager"}})).To(Succeed())
		alice, err := testEnv.AddUser(envtest.User{Name: "alice", Groups: []string{"oncall"}}, cfg)
		Expect(err).NotTo(HaveOccurred())
		cs, err := kubernetes.NewForConfig(alice.Config())
		Expect(err).NotTo(HaveOccurred())
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "quiesce-debug-reader",
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}},
			metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(tr.Status.Token).NotTo(BeEmpty())
		_, err = cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "controller-manager", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "a token of the operator's own ServiceAccount: %v", err)

		By("authenticating that token as the ServiceAccount, which may GET /debug/quiesce and not /metrics")
		review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token}}
		Expect(k8sClient.Create(ctx, review)).To(Succeed())
		Expect(review.Status.Authenticated).To(BeTrue())
		sa := review.Status.User
		Expect(sa.Username).To(Equal("system:serviceaccount:" + ns + ":quiesce-debug-reader"))
		Expect(allowed(ctx, sa.Username, sa.Groups, "/debug/quiesce")).To(BeTrue())
		Expect(allowed(ctx, sa.Username, sa.Groups, "/metrics")).To(BeFalse())
		Expect(allowed(ctx, "alice", []string{"oncall", "system:authenticated"}, "/debug/quiesce")).To(BeFalse(),
			"people read it through the ServiceAccount's short-lived token only")
	})
})
