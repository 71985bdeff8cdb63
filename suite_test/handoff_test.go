package suite_test

import (
	"cmp"
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
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
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

// replicaOptions say how handoffReplica makes a replica; the zero value: the suite's config,
// the real clock, LeaderElectionReleaseOnCancel off, runs that return at once.
type replicaOptions struct {
	cfg             *rest.Config                        // nil: the suite's
	clock           clock.WithTickerAndDelayedExecution // nil: the real clock
	releaseOnCancel bool
	hold            <-chan struct{} // nil: runs return at once
	also            []func(manager.Manager, *runnable.Runnable)
}

// handoffReplica makes a replica of an operator whose controller "handoff" (HandOffAtStop)
// reconciles the ConfigMaps of ns: a run blocks until o.hold is closed or its context ends.
// Its manager and quiesce log to logs.
func handoffReplica(ns, id string, o replicaOptions, runs *handoffRuns, logs *logLines) (manager.Manager, *runnable.Runnable) {
	GinkgoHelper()
	c, hold := cmp.Or(o.cfg, cfg), cmp.Or(o.hold, done())
	mo := managerOptions(inNamespace(ns), func(mo *manager.Options) {
		mo.Logger = logs.logger()
		mo.LeaderElection = true
		mo.LeaderElectionID = handoffLease
		mo.LeaderElectionNamespace = ns
		mo.LeaderElectionReleaseOnCancel = o.releaseOnCancel
		mo.LeaseDuration = ptr.To(4 * time.Second)
		mo.RenewDeadline = ptr.To(3 * time.Second)
		mo.RetryPeriod = ptr.To(200 * time.Millisecond)
		mo.GracefulShutdownTimeout = ptr.To(40 * time.Second)
	})
	// CancelAfter (20s) far above the bounds the specs put on a hand-over (10s): a stop
	// without one is told apart.
	q, err := runnable.Setup(c, &mo, runnable.Options{GracePeriod: 25 * time.Second, CancelAfter: 20 * time.Second,
		Clock: o.clock, Logger: logs.logger().WithName("quiesce")})
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(c, mo)
	Expect(err).NotTo(HaveOccurred())
	Expect(q.Add(mgr)).To(Succeed())
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
	for _, f := range o.also {
		f(mgr, q)
	}
	return mgr, q
}

// handoffPair is the start most hand-over specs share, in a namespace of their own: leader a
// elected, standby b started, and a mid-reconcile on the ConfigMap x, its run blocking until
// release. b starts before any claim exists: none is in its cache when a claims x.
type handoffPair struct {
	ns           string
	runs         *handoffRuns
	release      func() // ends a's runs
	logsA, logsB *logLines
	a, b         manager.Manager
	qa, qb       *runnable.Runnable
	holderA      string // a's identity, as the leader lease names it
	stopA, stopB context.CancelFunc
	doneA, doneB <-chan error
}

// startPair starts a pair, a made with oa (its hold: the pair's) and b with ob.
func startPair(ctx context.Context, oa, ob replicaOptions) *handoffPair {
	GinkgoHelper()
	p := &handoffPair{ns: newNamespace(ctx), runs: &handoffRuns{started: make(chan handoffRun, 16)},
		logsA: &logLines{}, logsB: &logLines{}}
	oa.hold, p.release = releaser()
	p.a, p.qa = handoffReplica(p.ns, "a", oa, p.runs, p.logsA)
	p.stopA, p.doneA = startManager(p.a, p.qa)
	Eventually(p.a.Elected(), 15*time.Second).Should(BeClosed())
	p.holderA = leaseHolder(ctx, p.ns)
	Expect(p.holderA).NotTo(BeEmpty())
	p.b, p.qb = handoffReplica(p.ns, "b", ob, p.runs, p.logsB)
	p.stopB, p.doneB = startManager(p.b, p.qb)
	configMap(ctx, p.ns, "x")
	Eventually(p.runs.started).Should(Receive(And(HaveField("Replica", "a"), HaveField("Object", "x"))))
	return p
}

// end stops b, expects its normal result, and no goroutine left beyond cur.
func (p *handoffPair) end(cur goleak.Option) {
	GinkgoHelper()
	p.stopB()
	Eventually(p.doneB, 30*time.Second).Should(Receive(BeNil()))
	expectNoLeaks(cur)
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
	for _, c := range []struct {
		edge, label     string
		releaseOnCancel bool
		slow            time.Duration // of every request of the old leader
	}{
		{"ReleaseOnCancel on", "releaseOnCancel", true, 0},
		{"ReleaseOnCancel off", "noReleaseOnCancel", false, 0},
		// 400ms: twice the RetryPeriod, far above the round trips the specs otherwise see; the
		// hand-over's writes (a claim, the lease's release: two or three requests) take 1.2s at
		// most of the RenewDeadline (3s) that bounds them: the lease is handed over.
		{"the API server slow: every request of the old leader taking 400ms", "slowAPIServer", true, 400 * time.Millisecond},
	} {
		It("should hand the lease over at once and never run an object claimed by the live old leader on the successor ("+c.edge+")",
			Label(c.label), func(ctx SpecContext) {
				cur := goleak.IgnoreCurrent()
				oa, slow := replicaOptions{releaseOnCancel: c.releaseOnCancel}, &slowdown{}
				if c.slow > 0 {
					oa.cfg = slow.config()
					slow.set(c.slow)
				}
				By("starting the successor b before the claim exists, so that no claim is in its cache when a claims x")
				p := startPair(ctx, oa, replicaOptions{releaseOnCancel: c.releaseOnCancel})

				By("stopping the leader mid-reconcile")
				stopped, writes := time.Now(), slow.leaseWrites.Load()
				p.stopA()
				Eventually(p.b.Elected(), 10*time.Second).Should(BeClosed(), "the lease is handed over without waiting for the work")
				Expect(time.Since(stopped)).To(BeNumerically("<", 10*time.Second))
				Expect(hasLine(p.logsA.all(), `"msg"="Handed the lease over"`)).To(BeTrue())
				claim, ok := claimOf(ctx, p.ns)
				Expect(ok).To(BeTrue(), "the old leader claims its object in flight")
				Expect(ptr.Deref(claim.Spec.HolderIdentity, "")).To(Equal(p.holderA))

				By("the successor leaving the claimed object alone, and running the others")
				configMap(ctx, p.ns, "y")
				Eventually(p.runs.started).Should(Receive(And(HaveField("Replica", "b"), HaveField("Object", "y"))))
				Consistently(func() []string { return p.runs.replicasOf("x") }, 3*time.Second).Should(BeEmpty(),
					"no replica ran x again while the old leader's run holds its claim")
				Eventually(func() []string { return p.runs.replicasOf("y") }).Should(Equal([]string{"b"}),
					"the old leader runs nothing new after the hand-over")
				if c.slow > 0 {
					Expect(slow.leaseWrites.Load()-writes).To(BeNumerically(">=", 3),
						"the claim's write, the lease's release and the claim's renewals all went through the slow client")
				}

				By("ending the old leader's work: its claim is released, and the successor runs the object")
				p.release()
				Eventually(p.doneA, 30*time.Second).Should(Receive(BeNil()), "the old leader's mgr.Start returns its normal result")
				Expect(p.qa.Err()).NotTo(HaveOccurred())
				Expect(hasLine(p.logsA.all(), `"msg"="Claimed work finished"`)).To(BeTrue())
				Expect(hasLine(p.logsA.all(), "Claim not renewed")).To(BeFalse(), "every renewal landed within its deadline")
				Eventually(p.runs.started, 15*time.Second).Should(Receive(And(HaveField("Replica", "b"), HaveField("Object", "x"))))
				Eventually(func() []string { return p.runs.replicasOf("x") }).Should(Equal([]string{"a", "b"}))
				x := p.runs.of("x")
				Expect(x[0].cause).ToNot(HaveOccurred(), "the old leader's work finished, not cut")
				Expect(x[1].start).To(BeTemporally(">=", x[0].end), "the successor ran x only once the old run ended")
				_, ok = claimOf(ctx, p.ns)
				Expect(ok).To(BeFalse(), "the claim is deleted when the work ends")
				Expect(lostAfterStop(p.logsA.all())).To(BeTrue(),
					"the old leader's elector never gave up: controller-runtime says \"leader election lost\" only once its stop is over")
				Consistently(func() string { return leaseHolder(ctx, p.ns) }, time.Second).
					ShouldNot(Equal(""), "the successor's lease is never blanked")
				Expect(leaseHolder(ctx, p.ns)).NotTo(Equal(p.holderA))
				p.end(cur)
			})
	}

	It("should hand over twice in a row, the third replica waiting for both old runs", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		holdB, releaseB := releaser()
		p := startPair(ctx, replicaOptions{releaseOnCancel: true}, replicaOptions{releaseOnCancel: true, hold: holdB})

		By("handing over from a to b, then from b, mid-reconcile of another object, to c")
		p.stopA()
		Eventually(p.b.Elected(), 10*time.Second).Should(BeClosed())
		c, qc := handoffReplica(p.ns, "c", replicaOptions{releaseOnCancel: true}, p.runs, &logLines{})
		stopC, doneC := startManager(c, qc)
		configMap(ctx, p.ns, "y")
		Eventually(p.runs.started, 15*time.Second).Should(Receive(And(HaveField("Replica", "b"), HaveField("Object", "y"))),
			"x stays claimed by a")
		p.stopB()
		Eventually(c.Elected(), 10*time.Second).Should(BeClosed(), "b hands over too while its run and a's still run")
		Expect(hasLine(p.logsB.all(), `"msg"="Handed the lease over"`)).To(BeTrue())
		Consistently(p.runs.started, 3*time.Second).ShouldNot(Receive(), "c runs neither claimed object")

		By("ending both old runs: c runs both objects")
		p.release()
		releaseB()
		Eventually(p.doneA, 30*time.Second).Should(Receive(BeNil()))
		Eventually(p.doneB, 30*time.Second).Should(Receive(BeNil()))
		Eventually(func() []string { return p.runs.replicasOf("x") }, 15*time.Second).Should(Equal([]string{"a", "c"}))
		Eventually(func() []string { return p.runs.replicasOf("y") }, 15*time.Second).Should(Equal([]string{"b", "c"}))
		for _, o := range []string{"x", "y"} {
			r := p.runs.of(o)
			Expect(r[1].start).To(BeTemporally(">=", r[0].end), "c ran %s only once the old run ended", o)
		}

		stopC()
		Eventually(doneC, 30*time.Second).Should(Receive(BeNil()))
		expectNoLeaks(cur)
	})

	It("should run an object whose holder died one claim duration after the successor first saw its claim, though the holder's renewTime is an hour old",
		func(ctx SpecContext) {
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
			started := time.Now() // the successor sees the claim first no earlier than this
			s, qs := handoffReplica(ns, "s", replicaOptions{releaseOnCancel: true}, runs, &logLines{})
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

	for _, way := range []struct {
		edge string
		slow bool
	}{
		{"a write of the claim by another conflicting with its renewals", false},
		{"the API server slow: its renewals taking longer than the renew deadline", true},
	} {
		It("should end the work's context when its claim can no longer be renewed ("+way.edge+"), the successor running the object only once that work ended",
			func(ctx SpecContext) {
				cur := goleak.IgnoreCurrent()
				oa, claimWrites := replicaOptions{releaseOnCancel: true}, &slowdown{only: claimWrite}
				if way.slow {
					oa.cfg = claimWrites.config()
				}
				p := startPair(ctx, oa, replicaOptions{releaseOnCancel: true})
				p.stopA()
				Eventually(p.b.Elected(), 10*time.Second).Should(BeClosed())

				var broken time.Time
				if way.slow {
					By("slowing the old leader's writes of claims to 10s: each renewal ends at its 3s deadline")
					broken = time.Now()
					claimWrites.set(10 * time.Second)
				} else {
					By("writing the claim under the old leader: its optimistic renewals conflict from now on")
					// The holder renews every RetryPeriod: a renewal between the read and the write
					// conflicts with the spec's write, which then reads the claim again.
					Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
						claim, ok := claimOf(ctx, p.ns)
						Expect(ok).To(BeTrue())
						claim.Annotations["example.com/touched"] = "by the spec"
						broken = time.Now()
						return k8sClient.Update(ctx, &claim)
					})).To(Succeed())
				}
				Eventually(p.doneA, 30*time.Second).Should(Receive(BeNil()))
				Expect(hasLine(p.logsA.all(), "Claim not renewed within its deadline: ending its work")).To(BeTrue(),
					"the fence is logged, however the renewals failed")
				Eventually(func() []string { return p.runs.replicasOf("x") }, 15*time.Second).Should(Equal([]string{"a", "b"}),
					"the successor runs x once the claim is released or expired by its clock")
				x := p.runs.of("x")
				Expect(x[0].cause).To(MatchError(ContainSubstring(claims.Name("handoff", p.ns, "x"))), "the cause names the claim")
				Expect(x[0].end.Sub(broken)).To(BeNumerically("<", 15*time.Second),
					"ended by the claim's 3s renew deadline, not at CancelAfter (20s)")
				Expect(x[1].start).To(BeTemporally(">=", x[0].end), "no run of the successor beside the fenced one")
				p.end(cur)
			})
	}

	It("should not hand the lease over while a reconcile of another policy is in flight", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		holdOther, releaseOther := releaser()
		otherStarted := make(chan struct{}, 4)
		other := func(mgr manager.Manager, q *runnable.Runnable) { // FinishAtStop, on the same objects
			Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("other").
				Complete(reconcilers.Wrap(q.Executor(), "other", reconcile.Func(
					func(context.Context, reconcile.Request) (reconcile.Result, error) {
						otherStarted <- struct{}{}
						<-holdOther
						return reconcile.Result{}, nil
					}), reconcilers.WrapOptions{}))).To(Succeed())
		}
		p := startPair(ctx, replicaOptions{releaseOnCancel: true, also: []func(manager.Manager, *runnable.Runnable){other}},
			replicaOptions{releaseOnCancel: true})
		Eventually(otherStarted).Should(Receive())

		p.stopA()
		Eventually(func() bool {
			return hasLine(p.logsA.all(), "Not handing the lease over: a reconcile of another stop policy is in flight")
		}, 10*time.Second).Should(BeTrue())
		Consistently(p.b.Elected(), 3*time.Second).ShouldNot(BeClosed(), "the lease stays with the old leader")
		Expect(hasLine(p.logsA.all(), `"msg"="Handed the lease over"`)).To(BeFalse())
		_, claimed := claimOf(ctx, p.ns)
		Expect(claimed).To(BeFalse(), "no claim is written when nothing is handed over")

		p.release()
		releaseOther()
		Eventually(p.doneA, 30*time.Second).Should(Receive(BeNil()))
		Eventually(p.b.Elected(), 15*time.Second).Should(BeClosed())
		p.end(cur)
	})

	for _, way := range []struct {
		edge string
		slow bool
	}{
		{"another holder's claim on the object", false},
		// 5s per claim write: above the RenewDeadline (3s) that bounds the hand-over's writes.
		{"the API server slow: the claim's write longer than the renew deadline that bounds the hand-over", true},
	} {
		It("should not hand the lease over when a claim cannot be taken ("+way.edge+"), the stop FinishAtStop's", func(ctx SpecContext) {
			cur := goleak.IgnoreCurrent()
			oa, claimWrites := replicaOptions{releaseOnCancel: true}, &slowdown{only: claimWrite}
			if way.slow {
				oa.cfg = claimWrites.config()
			}
			p := startPair(ctx, oa, replicaOptions{releaseOnCancel: true})
			if way.slow {
				By("slowing the old leader's writes of claims to 5s")
				claimWrites.set(5 * time.Second)
			} else {
				By("another holder claiming the object mid-reconcile")
				now := metav1.NewMicroTime(time.Now())
				Expect(k8sClient.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: claims.Name("handoff", p.ns, "x")},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("someone-else"), LeaseDurationSeconds: ptr.To[int32](300),
						RenewTime: &now, AcquireTime: &now},
				})).To(Succeed())
			}
			p.stopA()
			Eventually(func() bool { return hasLine(p.logsA.all(), "Not handing the lease over: a claim could not be taken") },
				10*time.Second).Should(BeTrue())
			Consistently(p.b.Elected(), 3*time.Second).ShouldNot(BeClosed(), "the lease stays with the old leader while its work runs")
			Expect(hasLine(p.logsA.all(), `"msg"="Handed the lease over"`)).To(BeFalse())
			Expect(leaseHolder(ctx, p.ns)).NotTo(BeEmpty())
			if way.slow {
				Expect(claimWrites.leaseWrites.Load()).To(BeNumerically(">=", 1), "the claim's write went through the slow client")
				_, ok := claimOf(ctx, p.ns)
				Expect(ok).To(BeFalse(), "no claim is left when nothing is handed over")
			}

			p.release()
			Eventually(p.doneA, 30*time.Second).Should(Receive(BeNil()))
			Expect(p.runs.of("x")[0].cause).ToNot(HaveOccurred(), "the work finished as under FinishAtStop")
			Eventually(p.b.Elected(), 15*time.Second).Should(BeClosed(), "released when the old leader's stop ended")
			if way.slow {
				Eventually(func() []string { return p.runs.replicasOf("x") }, 15*time.Second).Should(Equal([]string{"a", "b"}))
				x := p.runs.of("x")
				Expect(x[1].start).To(BeTemporally(">=", x[0].end), "the successor ran x only once the old run ended")
			} else {
				claim, ok := claimOf(ctx, p.ns)
				Expect(ok).To(BeTrue())
				Expect(ptr.Deref(claim.Spec.HolderIdentity, "")).To(Equal("someone-else"), "the other holder's claim is left alone")
				Expect(k8sClient.Delete(ctx, &claim, client.GracePeriodSeconds(0))).To(Succeed())
			}
			p.end(cur)
		})
	}
})
