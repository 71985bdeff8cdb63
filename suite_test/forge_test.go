package suite_test

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/lifecycle"
	"github.com/quiesce-dev/quiesce/runnable"
)

// statefulSet is a valid StatefulSet ns/name of one replica. A StatefulSet, not a
// Deployment: the API server bumps a Deployment's generation on any change of its
// annotations too, the progress annotation's own included.
func statefulSet(ns, name string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			ServiceName: name,
			Replicas:    ptr.To[int32](1),
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
			},
		},
	}
}

// editorOf makes a user who may get, update and patch StatefulSets in ns, and nothing else
// (not their status), and returns a client acting as that user.
func editorOf(ctx context.Context, ns, user string) client.Client {
	GinkgoHelper()
	return userWith(ctx, ns, user, "statefulset-editor", rbacv1.PolicyRule{
		APIGroups: []string{"apps"}, Resources: []string{"statefulsets"},
		Verbs: []string{"get", "list", "watch", "update", "patch"},
	})
}

// userWith makes a user whom the Role named role in ns grants rules, and nothing else, and
// returns a client acting as that user.
func userWith(ctx context.Context, ns, user, role string, rules ...rbacv1.PolicyRule) client.Client {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role}, Rules: rules})).
		To(Succeed())
	Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})).To(Succeed())
	u, err := testEnv.AddUser(envtest.User{Name: user}, cfg)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(u.Config(), client.Options{Scheme: scheme.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// expectWarnings waits for Warning Events of reason on the object key, n of them in all.
func expectWarnings(ctx context.Context, key types.NamespacedName, reason string, n int) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var evs eventsv1.EventList
		g.Expect(k8sClient.List(ctx, &evs, client.InNamespace(key.Namespace))).To(Succeed())
		count := 0
		for _, e := range evs.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning && e.Regarding.Name == key.Name {
				count += max(1, int(e.DeprecatedCount), int(ptr.Deref(e.Series, eventsv1.EventSeries{}).Count))
			}
		}
		g.Expect(count).To(BeNumerically(">=", n))
	}).Should(Succeed())
}

var _ = Describe("The progress of Handlers, written by a user who may edit the object", func() {
	It("should refuse, and report, progress forged without the ProgressKey", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "web"}
		mallory := editorOf(ctx, ns, "mallory")

		var runs handlerRuns // by generation
		h := lifecycle.Handler[*appsv1.StatefulSet]{ID: "h", Fn: func(_ context.Context, d *appsv1.StatefulSet) error {
			runs.add(strconv.FormatInt(d.Generation, 10))
			return nil
		}}
		mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 20 * time.Second}, handlersCacheIn(ns))
		Expect(err).NotTo(HaveOccurred())
		r, err := lifecycle.Handlers(q.Executor(), mgr.GetClient(), "forge", nil, []lifecycle.Handler[*appsv1.StatefulSet]{h},
			lifecycle.HandlersOptions{
				ProgressKey: []byte("a key only the operator holds, 32 bytes or more"),
				Recorder:    broadcaster.NewRecorder(scheme.Scheme, "forge"),
			})
		Expect(err).NotTo(HaveOccurred())
		Expect(ctrl.NewControllerManagedBy(mgr).For(&appsv1.StatefulSet{}).Named("forge").Complete(r)).To(Succeed())
		stop, done := startManager(mgr)

		// doneFor waits until the signed Record says h is done for gen.
		doneFor := func(gen int64) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				var d appsv1.StatefulSet
				g.Expect(k8sClient.Get(ctx, key, &d)).To(Succeed())
				raw := d.Annotations[lifecycle.DefaultProgressAnnotation]
				p, err := lifecycle.ParseRecord(raw)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(p.Generation).To(Equal(gen))
				g.Expect(p.Handlers["h"].Done).To(BeTrue())
				g.Expect(raw).To(ContainSubstring(`"mac":"`), "the operator signs what it writes")
			}).Should(Succeed())
		}
		// forge writes value into the progress annotation as mallory, in the same update as a
		// change of the spec when scale is set.
		forge := func(value string, scale *int32) {
			GinkgoHelper()
			Eventually(func() error {
				var d appsv1.StatefulSet
				if err := mallory.Get(ctx, key, &d); err != nil {
					return err
				}
				if scale != nil {
					d.Spec.Replicas = scale
				}
				d.Annotations[lifecycle.DefaultProgressAnnotation] = value
				return mallory.Update(ctx, &d)
			}).Should(Succeed())
		}
		warned := func(reason string, n int) { GinkgoHelper(); expectWarnings(ctx, key, reason, n) }

		By("running h once for generation 1")
		Expect(k8sClient.Create(ctx, statefulSet(ns, key.Name))).To(Succeed())
		doneFor(1)
		Expect(runs.get()).To(Equal(map[string]int{"1": 1}))

		By("checking that mallory may not write the status")
		var d appsv1.StatefulSet
		Expect(mallory.Get(ctx, key, &d)).To(Succeed())
		Expect(apierrors.IsForbidden(mallory.Status().Update(ctx, &d))).To(BeTrue(), "mallory has no status rights")

		By("forging h done for generation 2, in the update that makes generation 2")
		forge(`{"generation":2,"handlers":{"h":{"retries":0,"done":true}}}`, ptr.To[int32](2))
		warned(lifecycle.ReasonProgressForged, 1)
		doneFor(2)
		Expect(runs.get()).To(Equal(map[string]int{"1": 1, "2": 1}), "h runs for generation 2 all the same")

		By("writing a corrupt Record: h runs again, reported")
		forge(`{"generation":`, nil)
		warned(lifecycle.ReasonProgressCorrupt, 1)
		Eventually(runs.get).Should(Equal(map[string]int{"1": 1, "2": 2}))
		doneFor(2)

		By("forging a Record of another generation: refused, reported, h runs again")
		forge(`{"generation":7,"handlers":{"h":{"retries":0,"done":true}}}`, nil)
		warned(lifecycle.ReasonProgressForged, 2)
		Eventually(runs.get).Should(Equal(map[string]int{"1": 1, "2": 3}))
		doneFor(2)
		Consistently(runs.get, 2*time.Second).Should(Equal(map[string]int{"1": 1, "2": 3}), "never more than asked")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should refuse, once, the progress signed with a key since rotated, and run the handlers again", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "rotated"}
		var runs handlerRuns // by generation
		h := lifecycle.Handler[*appsv1.StatefulSet]{ID: "h", Fn: func(_ context.Context, d *appsv1.StatefulSet) error {
			runs.add(strconv.FormatInt(d.Generation, 10))
			return nil
		}}
		// start runs h in a manager whose Handlers sign with progressKey.
		start := func(progressKey string) (context.CancelFunc, <-chan error) {
			GinkgoHelper()
			mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 20 * time.Second}, handlersCacheIn(ns))
			Expect(err).NotTo(HaveOccurred())
			r, err := lifecycle.Handlers(q.Executor(), mgr.GetClient(), "rotated", nil, []lifecycle.Handler[*appsv1.StatefulSet]{h},
				lifecycle.HandlersOptions{ProgressKey: []byte(progressKey), Recorder: broadcaster.NewRecorder(scheme.Scheme, "rotated")})
			Expect(err).NotTo(HaveOccurred())
			Expect(ctrl.NewControllerManagedBy(mgr).For(&appsv1.StatefulSet{}).Named("rotated").Complete(r)).To(Succeed())
			return startManager(mgr)
		}
		// signed returns the progress annotation, and fails g unless it marks h done, signed.
		signed := func(g Gomega) string {
			var d appsv1.StatefulSet
			g.Expect(k8sClient.Get(ctx, key, &d)).To(Succeed())
			raw := d.Annotations[lifecycle.DefaultProgressAnnotation]
			p, err := lifecycle.ParseRecord(raw)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Handlers["h"].Done).To(BeTrue())
			g.Expect(raw).To(ContainSubstring(`"mac":"`))
			return raw
		}

		By("running h with the first key")
		stop, done := start("the first progress key, 32 bytes or more")
		Expect(k8sClient.Create(ctx, statefulSet(ns, key.Name))).To(Succeed())
		var first string
		Eventually(func(g Gomega) { first = signed(g) }).Should(Succeed())
		Expect(runs.get()).To(Equal(map[string]int{"1": 1}))
		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))

		By("restarting with the second key: the first key's Record is refused, reported, h runs once more")
		stop, done = start("the second progress key, 32 bytes or more")
		expectWarnings(ctx, key, lifecycle.ReasonProgressForged, 1)
		Eventually(runs.get).Should(Equal(map[string]int{"1": 2}))
		Eventually(func(g Gomega) { g.Expect(signed(g)).NotTo(Equal(first)) }).Should(Succeed(), "signed anew with the second key")
		Consistently(runs.get, time.Second).Should(Equal(map[string]int{"1": 2}), "once, not at every reconcile")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should not set up without a ProgressKey, unless UnsignedProgress says the annotation is trusted", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "trusted"}
		mallory := editorOf(ctx, ns, "mallory")
		var runs handlerRuns // by handler and generation
		run := func(id string) lifecycle.Handler[*appsv1.StatefulSet] {
			return lifecycle.Handler[*appsv1.StatefulSet]{ID: id, Fn: func(_ context.Context, d *appsv1.StatefulSet) error {
				runs.add(id + "/" + strconv.FormatInt(d.Generation, 10))
				return nil
			}}
		}
		// w, whose progress nobody forges, shows that the controller reconciled a generation.
		hs := []lifecycle.Handler[*appsv1.StatefulSet]{run("h"), run("w")}
		mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 20 * time.Second}, handlersCacheIn(ns))
		Expect(err).NotTo(HaveOccurred())

		By("refusing options that choose neither")
		_, err = lifecycle.Handlers(q.Executor(), mgr.GetClient(), "trusted", nil, hs,
			lifecycle.HandlersOptions{})
		Expect(err).To(MatchError(lifecycle.ErrInvalidHandlers))
		Expect(err).To(MatchError(And(ContainSubstring("set HandlersOptions.ProgressKey"), ContainSubstring("or UnsignedProgress to true"))))

		By("trusting the annotation with UnsignedProgress: a forged done for the next generation skips h")
		r, err := lifecycle.Handlers(q.Executor(), mgr.GetClient(), "trusted", nil, hs,
			lifecycle.HandlersOptions{UnsignedProgress: true})
		Expect(err).NotTo(HaveOccurred())
		Expect(ctrl.NewControllerManagedBy(mgr).For(&appsv1.StatefulSet{}).Named("trusted").Complete(r)).To(Succeed())
		stop, done := startManager(mgr)
		Expect(k8sClient.Create(ctx, statefulSet(ns, key.Name))).To(Succeed())
		ranFor1 := map[string]int{"h/1": 1, "w/1": 1}
		Eventually(runs.get).Should(Equal(ranFor1))
		Eventually(func(g Gomega) {
			var d appsv1.StatefulSet
			g.Expect(k8sClient.Get(ctx, key, &d)).To(Succeed())
			p, err := lifecycle.ParseRecord(d.Annotations[lifecycle.DefaultProgressAnnotation])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Handlers["h"].Done && p.Handlers["w"].Done).To(BeTrue())
		}).Should(Succeed())
		Eventually(func() error {
			var d appsv1.StatefulSet
			if err := mallory.Get(ctx, key, &d); err != nil {
				return err
			}
			d.Spec.Replicas = ptr.To[int32](2)
			d.Annotations[lifecycle.DefaultProgressAnnotation] = `{"generation":2,"handlers":{"h":{"retries":0,"done":true}}}`
			return mallory.Update(ctx, &d)
		}).Should(Succeed())
		// The controller reconciles generation 2: w runs, h, marked done by mallory, does not.
		ranFor2 := map[string]int{"h/1": 1, "w/1": 1, "w/2": 1}
		Eventually(runs.get).Should(Equal(ranFor2))
		Consistently(runs.get, time.Second).Should(Equal(ranFor2),
			"what UnsignedProgress documents: whoever may patch the object decides which handlers run")

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})
})
