package suite_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/lifecycle"
	"github.com/quiesce-dev/quiesce/runnable"
)

// handlersCacheIn restricts a manager's cache to ns: a Handlers reconciler patches every
// object it sees, and must see only the spec's own.
func handlersCacheIn(ns string) func(*manager.Options) {
	return func(o *manager.Options) {
		o.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	}
}

// handlerRuns counts the runs of each handler id.
type handlerRuns struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *handlerRuns) add(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[id]++
	return r.n[id]
}

func (r *handlerRuns) get() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// progressOf reads the progress annotation of the ConfigMap key from the API server.
func progressOf(ctx context.Context, key types.NamespacedName) (lifecycle.Record, error) {
	var cm corev1.ConfigMap
	if err := k8sClient.Get(ctx, key, &cm); err != nil {
		return lifecycle.Record{}, err
	}
	return lifecycle.ParseRecord(cm.Annotations[lifecycle.DefaultProgressAnnotation])
}

// progressKey is the suite operators' HandlersOptions.ProgressKey: one key for every manager
// of a spec, as every replica of an operator shares one.
var progressKey = []byte("the suite operators' progress key, 32 bytes or more")

// startHandlers makes a manager caching only ns, with a runnable.Runnable configured by
// default options, and a controller named name of the handlers hs on ConfigMaps; it starts the manager.
func startHandlers(ns, name string, hs []lifecycle.Handler[*corev1.ConfigMap], opts lifecycle.HandlersOptions) (q *runnable.Runnable, stop context.CancelFunc, done <-chan error) {
	GinkgoHelper()
	mgr, q := newHandlers(ns, name, hs, opts)
	stop, done = startManager(mgr)
	return q, stop, done
}

// newHandlers is startHandlers without the start.
func newHandlers(ns, name string, hs []lifecycle.Handler[*corev1.ConfigMap], opts lifecycle.HandlersOptions) (manager.Manager, *runnable.Runnable) {
	GinkgoHelper()
	mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 20 * time.Second}, handlersCacheIn(ns))
	Expect(err).NotTo(HaveOccurred())
	opts.Recorder = broadcaster.NewRecorder(scheme.Scheme, name)
	r, err := lifecycle.Handlers(q.Executor(), mgr.GetClient(), name, nil, hs, opts)
	Expect(err).NotTo(HaveOccurred())
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named(name).Complete(r)).To(Succeed())
	return mgr, q
}

var _ = Describe("The Handlers reconciler", func() {
	It("should resume after a restart: a not run again, b retried, c run", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "resume"}

		var runs handlerRuns
		bRunning := make(chan struct{})
		record := func(id string) lifecycle.Handler[*corev1.ConfigMap] {
			return lifecycle.Handler[*corev1.ConfigMap]{ID: id, Fn: func(context.Context, *corev1.ConfigMap) error {
				runs.add(id)
				return nil
			}}
		}
		b := lifecycle.Handler[*corev1.ConfigMap]{ID: "b", Fn: func(ctx context.Context, _ *corev1.ConfigMap) error {
			if runs.add("b") == 1 {
				// The first run is long: it lasts until the drain cancels it.
				close(bRunning)
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
		hs := []lifecycle.Handler[*corev1.ConfigMap]{record("a"), b, record("c")}
		opts := lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne, ProgressKey: progressKey}

		By("running the handlers until b runs, on a first manager")
		// CancelAfter 0: the drain cancels b's context at once.
		_, stop, done := startHandlers(ns, "handlers-resume", hs, opts)
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "resume"}})).To(Succeed())
		Eventually(bRunning).Should(BeClosed())

		By("stopping the first manager while b runs")
		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		Expect(runs.get()).To(Equal(map[string]int{"a": 1, "b": 1}))
		p, err := progressOf(ctx, key)
		Expect(err).NotTo(HaveOccurred())
		Expect(p.Handlers["a"].Done).To(BeTrue())
		Expect(p.Handlers["b"].Started).NotTo(BeNil(), "b is recorded as started")
		Expect(p.Handlers["b"].Done).To(BeFalse())
		Expect(p.Handlers["b"].Retries).To(BeZero(), "an interruption is not a failure")
		Expect(p.Handlers).NotTo(HaveKey("c"))

		By("starting a new manager, with the same ProgressKey: it accepts the first one's Record")
		_, stop, done = startHandlers(ns, "handlers-resume", hs, opts)
		Eventually(func(g Gomega) {
			p, err := progressOf(ctx, key)
			g.Expect(err).NotTo(HaveOccurred())
			for _, id := range []string{"a", "b", "c"} {
				g.Expect(p.Handlers[id].Done).To(BeTrue(), "handler %s done", id)
			}
		}).Should(Succeed())
		Expect(runs.get()).To(Equal(map[string]int{"a": 1, "b": 2, "c": 1}), "a not run again, b retried, c run")

		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, key, &cm)).To(Succeed())
		p, err = lifecycle.ParseRecord(cm.Annotations[lifecycle.DefaultProgressAnnotation])
		Expect(err).NotTo(HaveOccurred())
		Expect(p.Generation).To(Equal(cm.Generation), "the progress is that of the object's generation")
		for _, id := range []string{"a", "b", "c"} {
			Expect(p.Handlers[id].Failed).To(BeFalse())
			Expect(p.Handlers[id].Retries).To(BeZero())
		}

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		Consistently(runs.get).Should(Equal(map[string]int{"a": 1, "b": 2, "c": 1}))
		expectNoLeaks(cur)
	})

	It("should record, once, the outcome of handlers that change their own object", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "self-edit"}

		// Each handler changes the object (a label), so the save of the cycle's outcomes,
		// which carries the resourceVersion the cycle's start got, meets a conflict: it is
		// made again on the object read anew, through the manager's cache.
		var runs handlerRuns
		var c client.Client
		label := func(id string) lifecycle.Handler[*corev1.ConfigMap] {
			return lifecycle.Handler[*corev1.ConfigMap]{ID: id, Fn: func(ctx context.Context, cm *corev1.ConfigMap) error {
				runs.add(id)
				from := client.MergeFrom(cm.DeepCopy())
				if cm.Labels == nil {
					cm.Labels = map[string]string{}
				}
				cm.Labels["handled-by-"+id] = "true"
				return c.Patch(ctx, cm, from)
			}}
		}
		mgr, _ := newHandlers(ns, "handlers-self-edit", []lifecycle.Handler[*corev1.ConfigMap]{label("a"), label("b")},
			lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne, ProgressKey: progressKey})
		c = mgr.GetClient()
		stop, done := startManager(mgr)
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}})).
			To(Succeed())

		Eventually(func(g Gomega) {
			p, err := progressOf(ctx, key)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Handlers["a"].Done).To(BeTrue())
			g.Expect(p.Handlers["b"].Done).To(BeTrue())
		}).Should(Succeed())
		Consistently(runs.get, 2*time.Second).Should(Equal(map[string]int{"a": 1, "b": 1}),
			"each outcome recorded despite the conflict: no handler runs again")
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, key, &cm)).To(Succeed())
		Expect(cm.Labels).To(HaveKeyWithValue("handled-by-a", "true"))
		Expect(cm.Labels).To(HaveKeyWithValue("handled-by-b", "true"))

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should retry a failing handler with backoff and record its retries", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "flaky"}
		const handlerID = "flaky"

		var runs handlerRuns
		flaky := lifecycle.Handler[*corev1.ConfigMap]{ID: handlerID, Fn: func(context.Context, *corev1.ConfigMap) error {
			if n := runs.add(handlerID); n <= 2 {
				return fmt.Errorf("failed to reach the backend: attempt %d", n)
			}
			return nil
		}}
		_, stop, done := startHandlers(ns, "handlers-retry", []lifecycle.Handler[*corev1.ConfigMap]{flaky},
			lifecycle.HandlersOptions{Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, ProgressKey: progressKey})
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}})).To(Succeed())

		Eventually(func(g Gomega) {
			p, err := progressOf(ctx, key)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Handlers[handlerID].Done).To(BeTrue())
		}).Should(Succeed())
		p, err := progressOf(ctx, key)
		Expect(err).NotTo(HaveOccurred())
		h := p.Handlers[handlerID]
		Expect(h.Retries).To(Equal(2))
		Expect(h.Failed).To(BeFalse())
		Expect(h.Message).To(BeEmpty(), "the last error is cleared on success")
		Expect(runs.get()).To(Equal(map[string]int{handlerID: 3}))

		By("reporting each failure as a Warning Event on the object")
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var notes []string
			for _, e := range evs.Items {
				if e.Reason == lifecycle.ReasonHandlerError && e.Regarding.Name == key.Name && e.Type == corev1.EventTypeWarning {
					notes = append(notes, e.Note)
				}
			}
			// The backoff doubles from 20ms, shortened by a jitter of up to 10%.
			g.Expect(notes).To(ConsistOf(
				// The error's class, not its text (HandlersOptions.PublishErrors is off).
				MatchRegexp(`^Handler flaky failed, retry 1 after (1[89]|20)(\.\d+)?ms: error \(details in the operator's log\)$`),
				MatchRegexp(`^Handler flaky failed, retry 2 after (3[6-9]|40)(\.\d+)?ms: error \(details in the operator's log\)$`),
			))
		}).Should(Succeed())

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should fail a handler for good on a terminal error, and run the others", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "fatal"}
		const handlerID = "fatal"

		var runs handlerRuns
		fatal := lifecycle.Handler[*corev1.ConfigMap]{ID: handlerID, Fn: func(context.Context, *corev1.ConfigMap) error {
			runs.add(handlerID)
			return reconcile.TerminalError(fmt.Errorf("unsupported setting %q", "x"))
		}}
		after := lifecycle.Handler[*corev1.ConfigMap]{ID: "after", Fn: func(context.Context, *corev1.ConfigMap) error {
			runs.add("after")
			return nil
		}}
		_, stop, done := startHandlers(ns, "handlers-terminal", []lifecycle.Handler[*corev1.ConfigMap]{fatal, after},
			lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne, PublishErrors: true, ProgressKey: progressKey})
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}})).To(Succeed())

		Eventually(func(g Gomega) {
			p, err := progressOf(ctx, key)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Handlers["after"].Done).To(BeTrue())
		}).Should(Succeed())
		p, err := progressOf(ctx, key)
		Expect(err).NotTo(HaveOccurred())
		Expect(p.Handlers[handlerID]).To(And(
			HaveField("Done", BeTrue()), HaveField("Failed", BeTrue()), HaveField("Retries", BeZero()),
			HaveField("Message", Equal(`terminal error: unsupported setting "x"`))))
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8sClient.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			g.Expect(evs.Items).To(ContainElement(And(
				HaveField("Reason", lifecycle.ReasonHandlerFailed),
				HaveField("Type", corev1.EventTypeWarning),
				HaveField("Regarding.Name", key.Name),
				HaveField("Note", `Handler fatal failed for good: terminal error: unsupported setting "x"`))))
		}).Should(Succeed())

		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))
		Expect(runs.get()).To(Equal(map[string]int{handlerID: 1, "after": 1}), "the failed handler is not retried")
		expectNoLeaks(cur)
	})

	It("should call the lifecycle inline, never through the executor", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		key := types.NamespacedName{Namespace: ns, Name: "inline"}
		reconcileName := "handlers-inline/" + ns + "/inline"

		var mu sync.Mutex
		var calls []string          // the controller of every tracked call, as it returns
		var lifecycleSaw [][]string // what the executor tracked while the lifecycle ran
		var q *runnable.Runnable
		inline := func(pending []string, p map[string]lifecycle.Progress) []string {
			tracked := q.Executor().Pending()
			names := make([]string, 0, len(tracked))
			for _, c := range tracked {
				names = append(names, c.Name)
			}
			mu.Lock()
			lifecycleSaw = append(lifecycleSaw, names)
			mu.Unlock()
			return lifecycle.AllAtOnce(pending, p)
		}
		var runs handlerRuns
		ids := []string{"a", "b"}
		hs := make([]lifecycle.Handler[*corev1.ConfigMap], 0, len(ids))
		for _, id := range ids {
			hs = append(hs, lifecycle.Handler[*corev1.ConfigMap]{ID: id, Fn: func(context.Context, *corev1.ConfigMap) error {
				runs.add(id)
				return nil
			}})
		}
		var mgr manager.Manager
		mgr, q = newHandlers(ns, "handlers-inline", hs, lifecycle.HandlersOptions{Lifecycle: inline, UnsignedProgress: true})
		settings := internal.Of(q.Executor()).Settings()
		metered := settings.AfterCall
		settings.AfterCall = func(controller string, took time.Duration, err error) {
			mu.Lock()
			calls = append(calls, controller)
			mu.Unlock()
			metered(controller, took, err)
		}
		stop, done := startManager(mgr) // after q is set: the lifecycle reads it
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inline"}})).To(Succeed())
		Eventually(func(g Gomega) {
			p, err := progressOf(ctx, key)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(p.Handlers["a"].Done && p.Handlers["b"].Done).To(BeTrue())
		}).Should(Succeed())
		stop()
		Eventually(done, time.Minute).Should(Receive(BeNil()))

		mu.Lock()
		defer mu.Unlock()
		Expect(lifecycleSaw).NotTo(BeEmpty())
		for _, saw := range lifecycleSaw {
			Expect(saw).To(Equal([]string{reconcileName}), "only the reconcile is tracked while the lifecycle runs")
		}
		Expect(calls).To(HaveEach("handlers-inline"), "every tracked call belongs to the controller")
		Expect(len(calls)).To(BeNumerically(">=", 3), "at least one reconcile and the two handler calls")
		s := q.Executor().Stats()
		Expect(s.Started).To(Equal(uint64(len(calls))), "the executor started only reconciles and handler calls")
		Expect(runs.get()).To(Equal(map[string]int{"a": 1, "b": 1}))
		expectNoLeaks(cur)
	})
})
