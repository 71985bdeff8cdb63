package suite_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// run is one run of a handler, on one manager.
type run struct {
	manager    string
	start, end time.Time
}

var _ = Describe("Leader election with two managers", func() {
	It("should not start an object's handler on the new leader before the old leader's one finished", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)

		var mu sync.Mutex
		var runs []run
		handlerStarted := make(chan string, 2)
		newLeaderCandidate := func(id string) (manager.Manager, *runnable.Runnable) {
			// CancelAfter: the handler may finish its 2 s of work after the stop.
			mgr, q, err := newQuiesced(runnable.Options{CancelAfter: 10 * time.Second, GracePeriod: 15 * time.Second}, inNamespace(ns), func(o *manager.Options) {
				o.LeaderElection = true
				o.LeaderElectionID = "quiesce-leader-spec"
				o.LeaderElectionNamespace = ns
				o.LeaderElectionReleaseOnCancel = true
				o.LeaseDuration = ptr.To(4 * time.Second)
				o.RenewDeadline = ptr.To(3 * time.Second)
				o.RetryPeriod = ptr.To(200 * time.Millisecond)
			})
			Expect(err).NotTo(HaveOccurred())
			Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("leader").
				Complete(reconcilers.Wrap(q.Executor(), "leader", reconcile.Func(
					func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
						return reconcile.Result{}, reconcilers.Call(ctx, "work", func(ctx context.Context) error {
							r := run{manager: id, start: time.Now()}
							handlerStarted <- id
							select {
							case <-time.After(2 * time.Second): // the handler's work
							case <-ctx.Done():
								return ctx.Err()
							}
							r.end = time.Now()
							mu.Lock()
							defer mu.Unlock()
							runs = append(runs, r)
							return nil
						})
					}), reconcilers.WrapOptions{}))).To(Succeed())
			return mgr, q
		}

		mgrA, qa := newLeaderCandidate("a")
		stopA, doneA := startManager(mgrA)
		Eventually(mgrA.Elected(), 10*time.Second).Should(BeClosed())
		mgrB, qb := newLeaderCandidate("b")
		stopB, doneB := startManager(mgrB)
		Consistently(mgrB.Elected(), time.Second).ShouldNot(BeClosed(), "b waits while a leads")

		configMap(ctx, ns, "contended")
		Eventually(handlerStarted).Should(Receive(Equal("a")))

		By("stopping the leader mid-handler")
		stopA()
		Eventually(doneA, 20*time.Second).Should(Receive(BeNil()))
		Expect(qa.Err()).NotTo(HaveOccurred(), "a's handler finished within the grace period")
		Eventually(handlerStarted, 20*time.Second).Should(Receive(Equal("b")), "b leads and reconciles the object")

		stopB()
		Eventually(doneB, 20*time.Second).Should(Receive(BeNil()))
		Expect(qb.Err()).NotTo(HaveOccurred())

		mu.Lock()
		defer mu.Unlock()
		Expect(runs).To(HaveLen(2))
		Expect(runs[0].manager).To(Equal("a"))
		Expect(runs[1].manager).To(Equal("b"))
		Expect(runs[1].start).To(BeTemporally(">=", runs[0].end), "b started the handler only after a's one finished")
		draintest.VerifyNone(GinkgoT(), qa.Executor())
		draintest.VerifyNone(GinkgoT(), qb.Executor())
		expectNoLeaks(cur)
	})
})
