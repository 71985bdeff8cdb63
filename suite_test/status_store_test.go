package suite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/quiesce-dev/quiesce/internal/metricstest"
	"github.com/quiesce-dev/quiesce/lifecycle"
	"github.com/quiesce-dev/quiesce/runnable"
)

// statusProgress is the StatusField of the specs: .status.progress, a string in the CRDs.
const statusProgress = "progress"

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

	// startKind runs handler h of a controller name on the objects of newObj's kind in ns,
	// with opts (APIReader: the manager's), in a manager; runs counts h's runs by generation.
	startKind := func(ns, name string, newObj func() *unstructured.Unstructured, runs *handlerRuns,
		opts lifecycle.HandlersOptions) (context.CancelFunc, <-chan error) {
		GinkgoHelper()
		h := lifecycle.Handler[*unstructured.Unstructured]{ID: "h", Fn: func(_ context.Context, w *unstructured.Unstructured) error {
			runs.add(strconv.FormatInt(w.GetGeneration(), 10))
			return nil
		}}
		mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 20 * time.Second}, handlersCacheIn(ns))
		Expect(err).NotTo(HaveOccurred())
		opts.Recorder = broadcaster.NewRecorder(scheme.Scheme, name)
		opts.APIReader = mgr.GetAPIReader()
		r, err := lifecycle.Handlers(q.Executor(), mgr.GetClient(), name, newObj, []lifecycle.Handler[*unstructured.Unstructured]{h}, opts)
		Expect(err).NotTo(HaveOccurred())
		Expect(ctrl.NewControllerManagedBy(mgr).For(newObj()).Named(name).Complete(r)).To(Succeed())
		return startManager(mgr)
	}
	// start is startKind on Widgets.
	start := func(ns, name string, runs *handlerRuns, opts lifecycle.HandlersOptions) (context.CancelFunc, <-chan error) {
		GinkgoHelper()
		return startKind(ns, name, newWidget, runs, opts)
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
		stop, done := start(ns, "widgets-status", &runs, lifecycle.HandlersOptions{StatusField: statusProgress, UnsignedProgress: true})
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

	It("should report as too_large, with the object's size, a status store whose object labels grew to etcd's limit", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		mallory := widgetEditorOf(ctx, ns, "mallory")
		key := grownWidget(ctx, mallory, ns, "grown")

		var runs handlerRuns
		stop, done := start(ns, "widgets-grown", &runs, lifecycle.HandlersOptions{StatusField: statusProgress, UnsignedProgress: true})
		sized := regexp.MustCompile(`no handler runs until it is: the object is too large for the API server's storage \((\d+) bytes as JSON;`)
		var note string
		Eventually(func(g Gomega) {
			notes := warningNotes(ctx, key, lifecycle.ReasonProgressNotSaved)
			g.Expect(notes).NotTo(BeEmpty())
			note = notes[0]
		}).Should(Succeed())
		m := sized.FindStringSubmatch(note)
		Expect(m).NotTo(BeNil(), "the note %q", note)
		Expect(strconv.Atoi(m[1])).To(BeNumerically(">", 1<<20), "the object's size, in the note")
		Eventually(func() float64 { return progressSaveFailures("widgets-grown", "too_large") }).Should(BeNumerically(">=", 1))
		Expect(progressSaveFailures("widgets-grown", "error")).To(BeZero(), "not an internal error")
		Expect(runs.get()).To(BeEmpty(), "no handler runs before its start is recorded")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should report as invalid a status store on a kind without a status subresource", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		g := newGadget()
		g.SetNamespace(ns)
		g.SetName("no-status")
		Expect(k8sClient.Create(ctx, g)).To(Succeed())
		key := client.ObjectKeyFromObject(g)

		var runs handlerRuns
		stop, done := startKind(ns, "gadgets-status", newGadget, &runs, lifecycle.HandlersOptions{StatusField: statusProgress, UnsignedProgress: true})
		expectWarnings(ctx, key, lifecycle.ReasonProgressNotSaved, 1)
		Expect(warningNotes(ctx, key, lifecycle.ReasonProgressNotSaved)).To(ConsistOf(
			"Progress of the handlers not saved in status field .status.progress, no handler runs until it is: " +
				"the kind Gadget.suite.quiesce.dev has no status subresource to keep it in"))
		Eventually(func() float64 { return progressSaveFailures("gadgets-status", "invalid") }).Should(BeNumerically(">=", 1))
		Expect(runs.get()).To(BeEmpty(), "no handler runs before its start is recorded")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should cap labels and annotations with docs/security.md's ValidatingAdmissionPolicy, as written there", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		eve := widgetEditorOf(ctx, ns, "eve")
		for _, obj := range docsPolicy() {
			if obj.GetKind() == "ValidatingAdmissionPolicyBinding" {
				// This spec's namespace only: the API server's policy informer may still apply a
				// deleted policy for a moment, to the specs that run next.
				Expect(unstructured.SetNestedStringMap(obj.Object, map[string]string{"kubernetes.io/metadata.name": ns},
					"spec", "matchResources", "namespaceSelector", "matchLabels")).To(Succeed())
			}
			Expect(k8sClient.Create(ctx, obj)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
		}
		widget := func(labels int, annotations map[string]string) *unstructured.Unstructured {
			w := newWidget()
			w.SetNamespace(ns)
			w.SetGenerateName("caps-")
			l := map[string]string{}
			for i := range labels {
				l[fmt.Sprintf("l%02d", i)] = "x"
			}
			w.SetLabels(l)
			w.SetAnnotations(annotations)
			return w
		}
		By("refusing 65 labels, once the policy is in force")
		Eventually(func() error { return eve.Create(ctx, widget(65, nil)) }).Should(MatchError(ContainSubstring("at most 64 labels")))
		By("refusing an annotation of 4097 bytes, and 33 annotations")
		Expect(eve.Create(ctx, widget(0, map[string]string{"a.example/big": strings.Repeat("x", 4097)}))).
			To(MatchError(ContainSubstring("at most 32 annotations, each but quiesce.dev/progress at most 4096 bytes")))
		many := map[string]string{}
		for i := range 33 {
			many[fmt.Sprintf("a.example/a%02d", i)] = "x"
		}
		Expect(eve.Create(ctx, widget(0, many))).To(MatchError(ContainSubstring("at most 32 annotations")))
		By("admitting what is within the caps, and a larger progress annotation")
		Expect(eve.Create(ctx, widget(64, map[string]string{
			"a.example/big":                     strings.Repeat("x", 4096),
			lifecycle.DefaultProgressAnnotation: strings.Repeat("x", 10000),
		}))).To(Succeed())
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

// gadgetGVK is the kind of testdata/crds/gadgets.yaml: a custom resource with a string field
// .status.progress in its schema but no status subresource.
var gadgetGVK = schema.GroupVersionKind{Group: "suite.quiesce.dev", Version: "v1", Kind: "Gadget"}

func newGadget() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gadgetGVK)
	return u
}

// grownWidget creates Widget ns/name as editor, with labels that bring it near etcd's request
// limit (1.5 MiB), then adds labels, fewer and shorter each time one is too large, until the
// object sits less than 30 bytes under it: what an editor with no status rights can do.
func grownWidget(ctx context.Context, editor client.Client, ns, name string) types.NamespacedName {
	GinkgoHelper()
	w := newWidget()
	w.SetNamespace(ns)
	w.SetName(name)
	Expect(unstructured.SetNestedField(w.Object, int64(1), "spec", "size")).To(Succeed())
	labels := map[string]string{}
	for i := range 19000 { // 76 bytes each in JSON: 1.44 MB
		labels[fmt.Sprintf("l%05d", i)] = strings.Repeat("v", 63)
	}
	w.SetLabels(labels)
	Expect(editor.Create(ctx, w)).To(Succeed())
	next := 0
	for n, size := 64, 63; size > 8; {
		add := map[string]any{}
		for range n {
			add[fmt.Sprintf("g%05d", next)] = strings.Repeat("v", size)
			next++
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": add}})
		Expect(err).NotTo(HaveOccurred())
		switch perr := editor.Patch(ctx, w, client.RawPatch(types.MergePatchType, patch)); {
		case perr == nil:
		case strings.Contains(perr.Error(), "request is too large"):
			if n > 1 {
				n /= 2
			} else {
				size /= 2
			}
		default:
			Fail("failed to grow the widget: " + perr.Error())
		}
	}
	return client.ObjectKeyFromObject(w)
}

// warningNotes returns the notes of the Warning Events of reason on the object key.
func warningNotes(ctx context.Context, key types.NamespacedName, reason string) []string {
	GinkgoHelper()
	var evs eventsv1.EventList
	Expect(k8sClient.List(ctx, &evs, client.InNamespace(key.Namespace))).To(Succeed())
	var notes []string
	for _, e := range evs.Items {
		if e.Reason == reason && e.Type == corev1.EventTypeWarning && e.Regarding.Name == key.Name {
			notes = append(notes, e.Note)
		}
	}
	return notes
}

// docsPolicy returns the ValidatingAdmissionPolicy and its binding that docs/security.md shows,
// as written there but for its example group, example.com, made the Widgets' own.
func docsPolicy() []*unstructured.Unstructured {
	GinkgoHelper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "security.md"))
	Expect(err).NotTo(HaveOccurred())
	_, block, found := strings.Cut(string(doc), "```yaml\n# quiesce: caps on what editors may add")
	Expect(found).To(BeTrue(), "docs/security.md shows the policy")
	block, _, found = strings.Cut(block, "```")
	Expect(found).To(BeTrue())
	// The rest of the marker's comment line, a comment again.
	block = "#" + strings.ReplaceAll(block, "example.com", widgetGVK.Group)
	parts := strings.Split(block, "\n---\n")
	objs := make([]*unstructured.Unstructured, 0, len(parts))
	for _, part := range parts {
		u := &unstructured.Unstructured{}
		Expect(yaml.UnmarshalStrict([]byte(part), &u.Object)).To(Succeed())
		objs = append(objs, u)
	}
	Expect(objs).To(HaveLen(2))
	Expect(objs[0].GetKind()).To(Equal("ValidatingAdmissionPolicy"))
	Expect(objs[1].GetKind()).To(Equal("ValidatingAdmissionPolicyBinding"))
	return objs
}
