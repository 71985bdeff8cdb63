package suite_test

import (
	"context"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/internal/claims"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// handoffLease is the leader lease of the hand-over specs, in each spec's namespace.
const handoffLease = "quiesce-handoff"

// handoffRun is one run of the hand-over specs' reconciler, on one replica.
type handoffRun struct {
	Replica, Object string
	start, end      time.Time
	cause           error // why its context ended, if it did
}

// handoffRuns records the runs of every replica of a spec.
type handoffRuns struct {
	mu      sync.Mutex
	runs    []handoffRun
	started chan handoffRun // each run as it starts
}

func (h *handoffRuns) of(object string) []handoffRun {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []handoffRun
	for _, r := range h.runs {
		if r.Object == object {
			out = append(out, r)
		}
	}
	return out
}

// replicasOf returns which replicas ran object, in order of start.
func (h *handoffRuns) replicasOf(object string) []string {
	runs := h.of(object)
	out := make([]string, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.Replica)
	}
	return out
}

// handoffReplica makes a replica of an operator whose controller "handoff" (HandOffAtStop)
// reconciles the ConfigMaps of ns: a run blocks until hold is closed or its context ends.
// Its manager and quiesce log to logs.
func handoffReplica(ns, id string, releaseOnCancel bool, runs *handoffRuns, hold <-chan struct{}, logs *logLines,
	also ...func(manager.Manager, *runnable.Runnable),
) (manager.Manager, *runnable.Runnable) {
	GinkgoHelper()
	// CancelAfter (20s) far above the bounds the specs put on a hand-over (10s): a stop
	// without one is told apart.
	mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 25 * time.Second, CancelAfter: 20 * time.Second,
		Logger: logs.logger().WithName("quiesce")}, inNamespace(ns), func(o *manager.Options) {
		o.Logger = logs.logger()
		o.LeaderElection = true
		o.LeaderElectionID = handoffLease
		o.LeaderElectionNamespace = ns
		o.LeaderElectionReleaseOnCancel = releaseOnCancel
		o.LeaseDuration = ptr.To(4 * time.Second)
		o.RenewDeadline = ptr.To(3 * time.Second)
		o.RetryPeriod = ptr.To(200 * time.Millisecond)
		o.GracefulShutdownTimeout = ptr.To(40 * time.Second)
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("handoff").
		Complete(reconcilers.Wrap(q.Executor(), "handoff", reconcile.Func(
			func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
				r := handoffRun{Replica: id, Object: req.Name, start: time.Now()}
				runs.started <- r
				select {
				case <-hold:
				case <-ctx.Done():
					r.cause = context.Cause(ctx)
				}
				r.end = time.Now()
				runs.mu.Lock()
				defer runs.mu.Unlock()
				runs.runs = append(runs.runs, r)
				return reconcile.Result{}, nil
			}), reconcilers.WrapOptions{Stop: reconcilers.HandOffAtStop}))).To(Succeed())
	for _, f := range also {
		f(mgr, q)
	}
	return mgr, q
}

// done returns a closed channel: runs that do not wait.
func done() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// leaseHolder returns the holder of ns's leader lease ("" if none or not found).
func leaseHolder(ctx context.Context, ns string) string {
	var l coordinationv1.Lease
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: handoffLease}, &l); err != nil {
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// claimOf returns the claim of the controller "handoff" on ns/x, and whether it exists.
func claimOf(ctx context.Context, ns string) (coordinationv1.Lease, bool) {
	var l coordinationv1.Lease
	err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: claims.Name("handoff", ns, "x")}, &l)
	return l, err == nil
}

// hasLine reports whether one of lines contains s.
func hasLine(lines []string, s string) bool {
	for _, l := range lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// lostAfterStop reports whether controller-runtime's "leader election lost" comes only after
// "Wait completed" in lines: the elector stopped with the manager (controller-runtime v0.22
// to v0.25 say it then on every stop), it did not give up during the stop.
func lostAfterStop(lines []string) bool {
	completed := false
	for _, l := range lines {
		switch {
		case strings.Contains(l, "Wait completed, proceeding to shutdown the manager"):
			completed = true
		case strings.Contains(l, "leader election lost") && !completed:
			return false
		}
	}
	return completed
}

var _ = Describe("HandOffAtStop", func() {
	for _, releaseOnCancel := range []bool{true, false} {
		It("should hand the lease over at once and never run a claimed object on the successor while the old work runs",
			Label(map[bool]string{true: "releaseOnCancel", false: "noReleaseOnCancel"}[releaseOnCancel]),
			func(ctx SpecContext) {
				cur := goleak.IgnoreCurrent()
				ns := newNamespace(ctx)
				runs := &handoffRuns{started: make(chan handoffRun, 16)}
				hold, release := releaser()
				logsA, logsB := &logLines{}, &logLines{}
				a, qa := handoffReplica(ns, "a", releaseOnCancel, runs, hold, logsA)
				stopA, doneA := startManager(a, qa)
				Eventually(a.Elected(), 15*time.Second).Should(BeClosed())
				holderA := leaseHolder(ctx, ns)
				Expect(holderA).NotTo(BeEmpty())
				b, qb := handoffReplica(ns, "b", releaseOnCancel, runs, done(), logsB)
				stopB, doneB := startManager(b, qb)

				configMap(ctx, ns, "x")
				Eventually(runs.started).Should(Receive(HaveField("Replica", "a")))

				By("stopping the leader mid-reconcile")
				stopped := time.Now()
				stopA()
				Eventually(b.Elected(), 10*time.Second).Should(BeClosed(), "the lease is handed over without waiting for the work")
				Expect(time.Since(stopped)).To(BeNumerically("<", 10*time.Second))
				Expect(hasLine(logsA.all(), `"msg"="Handed the lease over"`)).To(BeTrue())
				claim, ok := claimOf(ctx, ns)
				Expect(ok).To(BeTrue(), "the old leader claims its object in flight")
				Expect(ptr.Deref(claim.Spec.HolderIdentity, "")).To(Equal(holderA))

				By("the successor leaving the claimed object alone, and running the others")
				configMap(ctx, ns, "y")
				Eventually(runs.started).Should(Receive(And(HaveField("Replica", "b"), HaveField("Object", "y"))))
				Consistently(func() []string { return runs.replicasOf("x") }, 3*time.Second).Should(BeEmpty(),
					"no replica ran x again while the old leader's run holds its claim")
				Eventually(func() []string { return runs.replicasOf("y") }).Should(Equal([]string{"b"}),
					"the old leader runs nothing new after the hand-over")

				By("ending the old leader's work: its claim is released, and the successor runs the object")
				release()
				Eventually(doneA, 30*time.Second).Should(Receive(BeNil()), "the old leader's mgr.Start returns its normal result")
				Expect(qa.Err()).NotTo(HaveOccurred())
				Expect(hasLine(logsA.all(), `"msg"="Claimed work finished"`)).To(BeTrue())
				Eventually(runs.started, 15*time.Second).Should(Receive(And(HaveField("Replica", "b"), HaveField("Object", "x"))))
				Eventually(func() []string { return runs.replicasOf("x") }).Should(Equal([]string{"a", "b"}))
				x := runs.of("x")
				Expect(x[0].cause).ToNot(HaveOccurred(), "the old leader's work finished, not cut")
				Expect(x[1].start).To(BeTemporally(">=", x[0].end), "the successor ran x only once the old run ended")
				_, ok = claimOf(ctx, ns)
				Expect(ok).To(BeFalse(), "the claim is deleted when the work ends")
				Expect(lostAfterStop(logsA.all())).To(BeTrue(),
					"the old leader's elector never gave up: controller-runtime says \"leader election lost\" only once its stop is over")
				Consistently(func() string { return leaseHolder(ctx, ns) }, time.Second).
					ShouldNot(Equal(""), "the successor's lease is never blanked")
				Expect(leaseHolder(ctx, ns)).NotTo(Equal(holderA))

				stopB()
				Eventually(doneB, 30*time.Second).Should(Receive(BeNil()))
				expectNoLeaks(cur)
			})
	}

	It("should hand over twice in a row, the third replica waiting for both old runs", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		runs := &handoffRuns{started: make(chan handoffRun, 16)}
		holdA, releaseA := releaser()
		holdB, releaseB := releaser()
		logsA, logsB, logsC := &logLines{}, &logLines{}, &logLines{}
		a, qa := handoffReplica(ns, "a", true, runs, holdA, logsA)
		stopA, doneA := startManager(a, qa)
		Eventually(a.Elected(), 15*time.Second).Should(BeClosed())
		b, qb := handoffReplica(ns, "b", true, runs, holdB, logsB)
		stopB, doneB := startManager(b, qb)
		configMap(ctx, ns, "x")
		Eventually(runs.started).Should(Receive(And(HaveField("Replica", "a"), HaveField("Object", "x"))))

		By("handing over from a to b, then from b, mid-reconcile of another object, to c")
		stopA()
		Eventually(b.Elected(), 10*time.Second).Should(BeClosed())
		c, qc := handoffReplica(ns, "c", true, runs, done(), logsC)
		stopC, doneC := startManager(c, qc)
		configMap(ctx, ns, "y")
		Eventually(runs.started, 15*time.Second).Should(Receive(And(HaveField("Replica", "b"), HaveField("Object", "y"))),
			"x stays claimed by a")
		stopB()
		Eventually(c.Elected(), 10*time.Second).Should(BeClosed(), "b hands over too while its run and a's still run")
		Expect(hasLine(logsB.all(), `"msg"="Handed the lease over"`)).To(BeTrue())
		Consistently(runs.started, 3*time.Second).ShouldNot(Receive(), "c runs neither claimed object")

		By("ending both old runs: c runs both objects")
		releaseA()
		releaseB()
		Eventually(doneA, 30*time.Second).Should(Receive(BeNil()))
		Eventually(doneB, 30*time.Second).Should(Receive(BeNil()))
		Eventually(func() []string { return runs.replicasOf("x") }, 15*time.Second).Should(Equal([]string{"a", "c"}))
		Eventually(func() []string { return runs.replicasOf("y") }, 15*time.Second).Should(Equal([]string{"b", "c"}))
		for _, o := range []string{"x", "y"} {
			r := runs.of(o)
			Expect(r[1].start).To(BeTemporally(">=", r[0].end), "c ran %s only once the old run ended", o)
		}

		stopC()
		Eventually(doneC, 30*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should run an object whose holder died one claim duration later, by the successor's own clock", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		By("leaving a claim as a replica killed mid-work leaves it: never renewed, its renewTime on a clock far behind")
		past := metav1.NewMicroTime(time.Now().Add(-time.Hour))
		Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claims.Name("handoff", ns, "x"),
				Labels: map[string]string{claims.ControllerLabel: "handoff"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("killed-replica"), LeaseDurationSeconds: ptr.To[int32](5),
				RenewTime: &past, AcquireTime: &past},
		})).To(Succeed())
		configMap(ctx, ns, "x")

		runs := &handoffRuns{started: make(chan handoffRun, 16)}
		hold, release := releaser()
		release()
		logs := &logLines{}
		started := time.Now() // the successor sees the claim first no earlier than this
		s, qs := handoffReplica(ns, "s", true, runs, hold, logs)
		stop, done := startManager(s, qs)
		var run handoffRun
		Eventually(runs.started, 30*time.Second).Should(Receive(&run))
		Expect(run.Object).To(Equal("x"))
		Expect(run.start.Sub(started)).To(BeNumerically(">=", 5*time.Second),
			"the claim's 5s count from the successor's own first sight of it, not from the holder's renewTime")

		stop()
		Eventually(done, 30*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should end the work's context when its claim can no longer be renewed", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		runs := &handoffRuns{started: make(chan handoffRun, 16)}
		hold, _ := releaser()
		logsA, logsB := &logLines{}, &logLines{}
		a, qa := handoffReplica(ns, "a", true, runs, hold, logsA)
		stopA, doneA := startManager(a, qa)
		Eventually(a.Elected(), 15*time.Second).Should(BeClosed())
		b, qb := handoffReplica(ns, "b", true, runs, done(), logsB)
		stopB, doneB := startManager(b, qb)
		configMap(ctx, ns, "x")
		Eventually(runs.started).Should(Receive(HaveField("Replica", "a")))
		stopA()
		Eventually(b.Elected(), 10*time.Second).Should(BeClosed())

		By("writing the claim under the old leader: its optimistic renewals conflict from now on")
		var broken time.Time
		// The holder renews every RetryPeriod: a renewal between the read and the write
		// conflicts with the spec's write, which then reads the claim again.
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			claim, ok := claimOf(ctx, ns)
			Expect(ok).To(BeTrue())
			claim.Annotations["example.com/touched"] = "by the spec"
			broken = time.Now()
			return k8sClient.Update(ctx, &claim)
		})).To(Succeed())
		Eventually(doneA, 30*time.Second).Should(Receive(BeNil()))
		Expect(hasLine(logsA.all(), "Claim not renewed within its deadline: ending its work")).To(BeTrue())
		Eventually(func() []string { return runs.replicasOf("x") }, 15*time.Second).Should(Equal([]string{"a", "b"}),
			"the successor runs x once the claim, still the old leader's, expired by its clock")
		x := runs.of("x")
		Expect(x[0].cause).To(MatchError(ContainSubstring(claims.Name("handoff", ns, "x"))), "the cause names the claim")
		Expect(x[0].end.Sub(broken)).To(BeNumerically("<", 15*time.Second),
			"ended by the claim's 3s renew deadline, not at CancelAfter (20s)")
		Expect(x[1].start).To(BeTemporally(">=", x[0].end), "no run of the successor beside the fenced one")

		stopB()
		Eventually(doneB, 30*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should not hand the lease over while a reconcile of another policy is in flight", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		runs := &handoffRuns{started: make(chan handoffRun, 16)}
		hold, release := releaser()
		otherStarted := make(chan struct{}, 4)
		other := func(mgr manager.Manager, q *runnable.Runnable) { // FinishAtStop, on the same objects
			Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("other").
				Complete(reconcilers.Wrap(q.Executor(), "other", reconcile.Func(
					func(context.Context, reconcile.Request) (reconcile.Result, error) {
						otherStarted <- struct{}{}
						<-hold
						return reconcile.Result{}, nil
					}), reconcilers.WrapOptions{}))).To(Succeed())
		}
		logsA, logsB := &logLines{}, &logLines{}
		a, qa := handoffReplica(ns, "a", true, runs, hold, logsA, other)
		stopA, doneA := startManager(a, qa)
		Eventually(a.Elected(), 15*time.Second).Should(BeClosed())
		b, qb := handoffReplica(ns, "b", true, runs, done(), logsB)
		stopB, doneB := startManager(b, qb)
		configMap(ctx, ns, "x")
		Eventually(runs.started).Should(Receive(HaveField("Replica", "a")))
		Eventually(otherStarted).Should(Receive())

		stopA()
		Eventually(func() bool {
			return hasLine(logsA.all(), "Not handing the lease over: a reconcile of another stop policy is in flight")
		}, 10*time.Second).Should(BeTrue())
		Consistently(b.Elected(), 3*time.Second).ShouldNot(BeClosed(), "the lease stays with the old leader")
		Expect(hasLine(logsA.all(), `"msg"="Handed the lease over"`)).To(BeFalse())
		_, claimed := claimOf(ctx, ns)
		Expect(claimed).To(BeFalse(), "no claim is written when nothing is handed over")

		release()
		Eventually(doneA, 30*time.Second).Should(Receive(BeNil()))
		Eventually(b.Elected(), 15*time.Second).Should(BeClosed())
		stopB()
		Eventually(doneB, 30*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should not hand the lease over when a claim cannot be taken", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		runs := &handoffRuns{started: make(chan handoffRun, 16)}
		hold, release := releaser()
		logsA, logsB := &logLines{}, &logLines{}
		a, qa := handoffReplica(ns, "a", true, runs, hold, logsA)
		stopA, doneA := startManager(a, qa)
		Eventually(a.Elected(), 15*time.Second).Should(BeClosed())
		b, qb := handoffReplica(ns, "b", true, runs, done(), logsB)
		stopB, doneB := startManager(b, qb)
		configMap(ctx, ns, "x")
		Eventually(runs.started).Should(Receive(HaveField("Replica", "a")))

		By("another holder claiming the object mid-reconcile")
		now := metav1.NewMicroTime(time.Now())
		Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claims.Name("handoff", ns, "x")},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else"), LeaseDurationSeconds: ptr.To[int32](300),
				RenewTime: &now, AcquireTime: &now},
		})).To(Succeed())
		stopA()
		Eventually(func() bool { return hasLine(logsA.all(), "Not handing the lease over: a claim could not be taken") },
			10*time.Second).Should(BeTrue())
		Consistently(b.Elected(), 3*time.Second).ShouldNot(BeClosed(), "the lease stays with the old leader while its work runs")
		Expect(hasLine(logsA.all(), `"msg"="Handed the lease over"`)).To(BeFalse())
		Expect(leaseHolder(ctx, ns)).NotTo(BeEmpty())

		release()
		Eventually(doneA, 30*time.Second).Should(Receive(BeNil()))
		Expect(runs.of("x")[0].cause).ToNot(HaveOccurred(), "the work finished as under FinishAtStop")
		Eventually(b.Elected(), 15*time.Second).Should(BeClosed(), "released when the old leader's stop ended")
		claim, ok := claimOf(ctx, ns)
		Expect(ok).To(BeTrue())
		Expect(ptr.Deref(claim.Spec.HolderIdentity, "")).To(Equal("someone-else"), "the other holder's claim is left alone")
		Expect(k8sClient.Delete(ctx, &claim, client.GracePeriodSeconds(0))).To(Succeed())

		stopB()
		Eventually(doneB, 30*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})
})
