package suite_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/internal/metricstest"
	"github.com/quiesce-dev/quiesce/lifecycle"
	"github.com/quiesce-dev/quiesce/runnable"
)

// widgetGVK is the kind of testdata/crds/widgets.yaml: a custom resource with a status
// subresource and a string field .status.progress.
var widgetGVK = schema.GroupVersionKind{Group: "suite.quiesce.dev", Version: "v1", Kind: "Widget"}

func newWidget() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(widgetGVK)
	return u
}

// widgetEditorOf makes a user who may do anything with Widgets in ns but read their status,
// as kubebuilder's <kind>-editor-role (aggregated into the edit role) allows, and returns a
// client acting as that user.
func widgetEditorOf(ctx context.Context, ns, user string) client.Client {
	GinkgoHelper()
	const verbGet = "get"
	return userWith(ctx, ns, user, "widget-editor",
		rbacv1.PolicyRule{APIGroups: []string{widgetGVK.Group}, Resources: []string{"widgets"},
			Verbs: []string{"create", "delete", verbGet, "list", "patch", "update", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{widgetGVK.Group}, Resources: []string{"widgets/status"}, Verbs: []string{verbGet}})
}

// progressSaveFailures returns quiesce_progress_save_failures_total{controller, reason}.
func progressSaveFailures(controller, reason string) float64 {
	GinkgoHelper()
	return metricstest.Value(GinkgoT(), "quiesce_progress_save_failures_total",
		map[string]string{"controller": controller, "reason": reason})
}

var _ = Describe("The progress of Handlers beside a user who may edit the object but not its status", Ordered, func() {
	crds := envtest.CRDInstallOptions{Paths: []string{filepath.Join("testdata", "crds")}}
	BeforeAll(func() {
		_, err := envtest.InstallCRDs(cfg, crds)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(envtest.UninstallCRDs(cfg, crds)).To(Succeed()) })
	})

	// start runs handler h of a controller name on Widgets of ns, with opts, in a manager;
	// runs counts h's runs by generation.
	start := func(ns, name string, runs *handlerRuns, opts lifecycle.HandlersOptions) (context.CancelFunc, <-chan error) {
		GinkgoHelper()
		h := lifecycle.Handler[*unstructured.Unstructured]{ID: "h", Fn: func(_ context.Context, w *unstructured.Unstructured) error {
			runs.add(strconv.FormatInt(w.GetGeneration(), 10))
			return nil
		}}
		mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 20 * time.Second}, handlersCacheIn(ns))
		Expect(err).NotTo(HaveOccurred())
		opts.Recorder = broadcaster.NewRecorder(scheme.Scheme, name)
		r, err := lifecycle.Handlers(q.Executor(), mgr.GetClient(), name, newWidget, []lifecycle.Handler[*unstructured.Unstructured]{h}, opts)
		Expect(err).NotTo(HaveOccurred())
		Expect(ctrl.NewControllerManagedBy(mgr).For(newWidget()).Named(name).Complete(r)).To(Succeed())
		return startManager(mgr)
	}

	// filledWidget creates Widget ns/name, then, as editor, fills its annotations to 64 bytes
	// under the API server's limit with one of editor's own, and writes into the progress
	// annotation a Record marking h done for generation 1.
	filledWidget := func(ctx context.Context, editor client.Client, ns, name string) types.NamespacedName {
		GinkgoHelper()
		w := newWidget()
		w.SetNamespace(ns)
		w.SetName(name)
		Expect(unstructured.SetNestedField(w.Object, int64(1), "spec", "size")).To(Succeed())
		Expect(editor.Create(ctx, w)).To(Succeed())
		const forged = `{"generation":1,"handlers":{"h":{"retries":0,"done":true}}}`
		const fillKey = "fill.example/data"
		size := 262144 - 64 - len(fillKey) - len(lifecycle.DefaultProgressAnnotation) - len(forged)
		from := client.MergeFrom(w.DeepCopy())
		w.SetAnnotations(map[string]string{fillKey: strings.Repeat("x", size), lifecycle.DefaultProgressAnnotation: forged})
		Expect(editor.Patch(ctx, w, from)).To(Succeed())
		return client.ObjectKeyFromObject(w)
	}

	It("should keep the progress in the status, which annotations of any size do not block and the editor cannot write", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		mallory := widgetEditorOf(ctx, ns, "mallory")
		key := filledWidget(ctx, mallory, ns, "status")

		By("running h for generation 1, its progress in .status.progress, the forged annotation unread")
		var runs handlerRuns
		// UnsignedProgress: only the operator may patch the status, so the Record is trusted.
		stop, done := start(ns, "widgets-status", &runs, lifecycle.HandlersOptions{StatusField: "progress", UnsignedProgress: true})
		progressFor := func(gen int64) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				w := newWidget()
				g.Expect(k8sClient.Get(ctx, key, w)).To(Succeed())
				raw, _, err := unstructured.NestedString(w.Object, "status", "progress")
				g.Expect(err).NotTo(HaveOccurred())
				p, err := lifecycle.ParseRecord(raw)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(p.Generation).To(Equal(gen))
				g.Expect(p.Handlers["h"].Done).To(BeTrue())
			}).Should(Succeed())
		}
		progressFor(1)
		Expect(runs.get()).To(Equal(map[string]int{"1": 1}))

		By("checking that mallory may not write the status")
		w := newWidget()
		Expect(mallory.Get(ctx, key, w)).To(Succeed())
		from := client.MergeFrom(w.DeepCopy())
		Expect(unstructured.SetNestedField(w.Object, `{"generation":2,"handlers":{"h":{"retries":0,"done":true}}}`,
			"status", "progress")).To(Succeed())
		Expect(apierrors.IsForbidden(mallory.Status().Patch(ctx, w, from))).To(BeTrue(), "mallory has no status rights")

		By("forging h done for generation 2 in the annotation, in the update that makes generation 2: h runs")
		Eventually(func() error {
			w := newWidget()
			if err := mallory.Get(ctx, key, w); err != nil {
				return err
			}
			if err := unstructured.SetNestedField(w.Object, int64(2), "spec", "size"); err != nil {
				return err
			}
			ann := w.GetAnnotations()
			ann[lifecycle.DefaultProgressAnnotation] = `{"generation":2,"handlers":{"h":{"retries":0,"done":true}}}`
			w.SetAnnotations(ann)
			return mallory.Update(ctx, w)
		}).Should(Succeed())
		progressFor(2)
		Expect(runs.get()).To(Equal(map[string]int{"1": 1, "2": 1}))
		Consistently(runs.get, time.Second).Should(Equal(map[string]int{"1": 1, "2": 1}), "once per generation")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should report, by an Event and the metric, progress that cannot be saved in filled annotations", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		mallory := widgetEditorOf(ctx, ns, "mallory")
		key := filledWidget(ctx, mallory, ns, "filled")

		var runs handlerRuns
		stop, done := start(ns, "widgets-annotation", &runs,
			lifecycle.HandlersOptions{ProgressKey: []byte("a key only the operator holds, 32 bytes or more")})
		expectWarnings(ctx, key, lifecycle.ReasonProgressNotSaved, 1)
		Eventually(func() float64 { return progressSaveFailures("widgets-annotation", "too_large") }).Should(BeNumerically(">=", 1))
		Expect(runs.get()).To(BeEmpty(), "no handler runs before its start is recorded")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})
})
