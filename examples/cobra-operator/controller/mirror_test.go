package controller_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/quiesce-dev/quiesce/examples/cobra-operator/controller"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ns is the namespace of the tests' ConfigMaps.
const ns = "default"

// A reconcile done twice, as after a stop that cut it or on the next leader, leaves the
// mirror as one reconcile does; a change of the data reaches the mirror.
func TestMirrorIsIdempotent(t *testing.T) {
	src := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: ns, UID: "uid-1",
			Labels: map[string]string{controller.MirrorLabel: "true"}},
		Data: map[string]string{"a": "1"},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(src).Build()
	r := &controller.Mirror{Client: c} // no Executor: untracked
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "settings"}}
	key := types.NamespacedName{Namespace: ns, Name: controller.MirrorName("settings")}
	ctx := context.Background()

	versions := make([]string, 0, 2)
	for range 2 {
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		var mirror corev1.ConfigMap
		if err := c.Get(ctx, key, &mirror); err != nil {
			t.Fatal(err)
		}
		if mirror.Data["a"] != "1" || len(mirror.OwnerReferences) != 1 || mirror.OwnerReferences[0].UID != "uid-1" {
			t.Fatalf("mirror = %+v, want the data and its owner", mirror)
		}
		versions = append(versions, mirror.ResourceVersion)
	}
	if versions[0] != versions[1] {
		t.Fatalf("the second reconcile changed the mirror: resourceVersion %s, then %s", versions[0], versions[1])
	}

	src.Data = map[string]string{"a": "2"}
	if err := c.Update(ctx, src); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	var mirror corev1.ConfigMap
	if err := c.Get(ctx, key, &mirror); err != nil || mirror.Data["a"] != "2" {
		t.Fatalf("mirror after the change: %v, %+v", err, mirror.Data)
	}
}

func TestValidator(t *testing.T) {
	cm := func(name string, labelled bool) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		if labelled {
			c.Labels = map[string]string{controller.MirrorLabel: "true"}
		}
		return c
	}
	long := strings.Repeat("a", 250) // a valid name, but its mirror's is 257 characters
	for _, tc := range []struct {
		cm   *corev1.ConfigMap
		want string // in the error; "": allowed
	}{
		{cm: cm("settings", true)},
		{cm: cm(long, false)},
		{cm: cm(long, true), want: "its mirror's name, " + long + "-mirror, would be invalid"},
	} {
		_, err := controller.Validator{}.ValidateCreate(context.Background(), tc.cm)
		_, errUpdate := controller.Validator{}.ValidateUpdate(context.Background(), tc.cm, tc.cm)
		for _, err := range []error{err, errUpdate} {
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%.20s: %v, want it allowed", tc.cm.Name, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("%.20s: %v, want an error with %q", tc.cm.Name, err, tc.want)
			}
		}
	}
}
