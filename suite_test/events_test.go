package suite_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// eventsOf returns the reasons of the Events on the object whose UID is uid, oldest first.
func eventsOf(ctx context.Context, ns string, uid types.UID) []string {
	var list corev1.EventList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(uid))})).To(Succeed())
	out := make([]string, 0, len(list.Items))
	for _, e := range list.Items {
		out = append(out, e.Reason)
	}
	return out
}

// printEvents writes the Events on the object whose UID is uid as `kubectl describe` lists them.
func printEvents(ctx context.Context, ns string, uid types.UID) {
	var list corev1.EventList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(ns),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(uid))})).To(Succeed())
	GinkgoWriter.Println("Events:\n  Type     Reason              From      Message")
	for _, e := range list.Items {
		from := e.Source.Component
		if from == "" {
			from = e.ReportingController // an events.k8s.io/v1 Event
		}
		GinkgoWriter.Printf("  %-8s %-19s %-9s %s\n", e.Type, e.Reason, from, e.Message)
	}
}

// newRecorder returns the recorder a controller-runtime v0.22 operator builds for itself
// (mgr.GetEventRecorder exists from v0.23 on), and the function that stops it (called at
// the end of the spec at the latest).
func newRecorder(name string) (events.EventRecorder, func()) {
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	adapter := events.NewEventBroadcasterAdapter(cs)
	stopCh := make(chan struct{})
	adapter.StartRecordingToSink(stopCh)
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(stopCh)
			adapter.Shutdown()
		})
	}
	DeferCleanup(stop)
	return adapter.NewRecorder(name), stop
}

var _ = Describe("Options.Recorder", func() {
	It("should record ReconcileSlow once while a reconcile stays slow, and ReconcileAbandoned at the end of the grace period",
		func(ctx SpecContext) {
			cur := goleak.IgnoreCurrent()
			ns := newNamespace(ctx)
			var logs logLines
			mgr, q, err := newQuiesced(runnable.Options{
				Logger: logs.logger(), SlowAfter: drain.MinSlowAfter, ReportEvery: drain.MinReportEvery,
				GracePeriod: 2 * time.Second,
			}, inNamespace(ns))
			Expect(err).NotTo(HaveOccurred())
			hold, release := releaser()
			stuck := make(chan struct{}, 1)
			rec, stopRecorder := newRecorder("evented")
			Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("evented").
				Complete(reconcilers.Wrap(q.Executor(), "evented", reconcile.Func(
					func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
						return reconcile.Result{}, reconcilers.Call(ctx, "export", func(context.Context) error {
							stuck <- struct{}{}
							<-hold // ignores its context
							return nil
						})
					}), reconcilers.WrapOptions{
					Recorder: rec,
					Reader:   mgr.GetClient(),
					Object:   &corev1.ConfigMap{},
				}))).To(Succeed())
			stop, done := startManager(mgr)
			var cm corev1.ConfigMap
			Expect(k8sClient.Get(ctx, configMap(ctx, ns, "cm"), &cm)).To(Succeed())
			Eventually(stuck).Should(Receive())

			By("recording one ReconcileSlow Event on the object while it stays slow")
			Eventually(func() []string { return eventsOf(ctx, ns, cm.UID) }, 10*time.Second).
				Should(Equal([]string{reconcilers.ReasonReconcileSlow}))
			Consistently(func() []string { return eventsOf(ctx, ns, cm.UID) }, 2*time.Second).
				Should(Equal([]string{reconcilers.ReasonReconcileSlow}))

			By("recording ReconcileAbandoned once the grace period ran out")
			stop()
			Eventually(done, time.Minute).Should(Receive())
			Expect(q.Err()).To(HaveOccurred())
			Eventually(func() []string { return eventsOf(ctx, ns, cm.UID) }, 10*time.Second).
				Should(ConsistOf(reconcilers.ReasonReconcileSlow, reconcilers.ReasonReconcileAbandoned))
			printEvents(ctx, ns, cm.UID)

			release()
			stopRecorder()
			expectNoLeaks(cur)
		})
})
