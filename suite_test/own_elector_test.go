package suite_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// writer is a reconcile that writes its ConfigMap again and again until its context ends,
// recording when each write that landed was sent.
type writer struct {
	c       client.Client
	started chan struct{}
	mu      sync.Mutex
	writes  []time.Time
	cause   error
	ended   time.Time
}

func (w *writer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	select {
	case w.started <- struct{}{}:
	default:
	}
	for i := 0; ; i++ {
		sent := time.Now()
		cm := &corev1.ConfigMap{}
		err := w.c.Get(ctx, req.NamespacedName, cm)
		if err == nil {
			cm.Data = map[string]string{"write": strconv.Itoa(i)}
			err = w.c.Update(ctx, cm)
		}
		if err == nil {
			w.mu.Lock()
			w.writes = append(w.writes, sent)
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			w.mu.Lock()
			w.cause, w.ended = context.Cause(ctx), time.Now()
			w.mu.Unlock()
			return reconcile.Result{}, ctx.Err()
		case <-time.After(50 * time.Millisecond): // the pace of the work, not a wait for a state
		}
	}
}

// writerOutcome is what a writer saw: when the last write that landed was sent, how many
// landed, and when and why its context ended.
type writerOutcome struct {
	last, ended time.Time
	n           int
	cause       error
}

func (w *writer) outcome() writerOutcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	o := writerOutcome{n: len(w.writes), cause: w.cause, ended: w.ended}
	if o.n > 0 {
		o.last = w.writes[o.n-1]
	}
	return o
}

// quiescedWriter is a manager with controller-runtime's leader election off, quiesce set
// up, and a writer on the ConfigMap "work" of a namespace of its own.
func quiescedWriter(ctx context.Context, opts runnable.Options) (string, manager.Manager, *runnable.Runnable, *writer, *logLines) {
	GinkgoHelper()
	ns := newNamespace(ctx)
	logs := &logLines{}
	opts.Logger = logs.logger()
	mgr, q, err := newQuiesced(opts, inNamespace(ns),
		func(o *manager.Options) { o.GracefulShutdownTimeout = ptr.To(opts.GracePeriod + 4*time.Second) })
	Expect(err).NotTo(HaveOccurred())
	w := &writer{c: mgr.GetClient(), started: make(chan struct{}, 1)}
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("writer").
		Complete(reconcilers.Wrap(q.Executor(), "writer", w, reconcilers.WrapOptions{}))).To(Succeed())
	return ns, mgr, q, w, logs
}

// Issue 49, item 1: an operator's own elector (client-go's RunOrDie, the manager's leader
// election off) on a lock wrapped by q.WrapLock; the lease becomes unreachable in the
// middle of a reconcile that keeps writing.
var _ = Describe("Fencing under the operator's own elector", func() {
	It("should write nothing tracked after the last renewal + RenewDeadline when the lock becomes unreachable", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns, mgr, q, w, logs := quiescedWriter(ctx, runnable.Options{GracePeriod: fenceGrace, ShutdownDelay: fenceDelay})
		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		inner, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, "quiesce-own-elector", cs.CoreV1(), cs.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: "replica-" + ns})
		Expect(err).NotTo(HaveOccurred())
		lock := &breakableLock{Interface: inner}

		// The operator's main: the manager runs while this replica leads.
		signal, sigterm := context.WithCancel(context.Background())
		defer sigterm()
		mgrDone := make(chan error, 1)
		electorDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(electorDone)
			leaderelection.RunOrDie(signal, leaderelection.LeaderElectionConfig{
				Lock: q.WrapLock(lock, runnable.LockOptions{LeaseDuration: fenceLeaseDuration,
					RenewDeadline: fenceRenewDeadline, RetryPeriod: fenceRetryPeriod}),
				LeaseDuration: fenceLeaseDuration, RenewDeadline: fenceRenewDeadline, RetryPeriod: fenceRetryPeriod,
				ReleaseOnCancel: true,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(context.Context) { mgrDone <- mgr.Start(q.StopContext(signal)) },
					OnStoppedLeading: func() {},
				},
			})
		}()
		configMap(ctx, ns, "work")
		Eventually(w.started, 15*time.Second).Should(Receive(), "the reconcile is in flight")
		Eventually(func() int { return w.outcome().n }, 10*time.Second).Should(BeNumerically(">=", 3))

		lock.breakRenewals()
		Eventually(func() error { return w.outcome().cause }, fenceGrace).Should(HaveOccurred())
		Eventually(mgrDone, 20*time.Second).Should(Receive(), "the manager stopped on the lost lease")
		Eventually(electorDone, 20*time.Second).Should(BeClosed())
		Eventually(q.Done(), 10*time.Second).Should(BeClosed())

		o := w.outcome()
		last, n, cause, ended := o.last, o.n, o.cause, o.ended
		renewed := lock.last()
		GinkgoWriter.Printf("own elector | %d writes, the last %v after the last renewal, context ended %v after it (%v)\n",
			n, last.Sub(renewed), ended.Sub(renewed), cause)
		Expect(cause).To(MatchError("leader election lost"))
		// The fence fires RetryPeriod + RenewDeadline after the renewal was sent; a write
		// sent before it may land a request's time later. ShutdownDelay (3s) never ran.
		Expect(last.Sub(renewed)).To(BeNumerically("<", fenceRenewDeadline+fenceRetryPeriod+500*time.Millisecond))
		Expect(ended.Sub(renewed)).To(BeNumerically("<", fenceRenewDeadline+fenceRetryPeriod+500*time.Millisecond))
		Expect(logs.messages()).To(ContainElement("Leadership lost: cancelling calls"))
		expectNoLeaks(cur)
	})

	It("should end every tracked context and the manager's at once on LeaseLost", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns, mgr, q, w, logs := quiescedWriter(ctx, runnable.Options{GracePeriod: fenceGrace, ShutdownDelay: fenceDelay})
		_, done := startManager(mgr, q)
		configMap(ctx, ns, "work")
		Eventually(w.started, 15*time.Second).Should(Receive(), "the reconcile is in flight")
		Eventually(func() int { return w.outcome().n }, 10*time.Second).Should(BeNumerically(">=", 3))

		lost := time.Now()
		q.LeaseLost(errors.New("the operator's elector stopped leading"))
		// The contexts ended as LeaseLost returned; the reconcile sees it on its own goroutine.
		Eventually(func() error { return w.outcome().cause }, 10*time.Second).Should(MatchError("leader election lost"))
		o := w.outcome()
		last, ended := o.last, o.ended
		Expect(ended.Sub(lost)).To(BeNumerically("<", 500*time.Millisecond))
		Expect(last.Before(lost)).To(BeTrue(), "no write sent after LeaseLost")
		Eventually(done, 20*time.Second).Should(Receive(BeNil()), "the manager stopped, without the shutdown delay")
		Eventually(q.Done(), 10*time.Second).Should(BeClosed())
		Expect(logs.all()).To(ContainElement(ContainSubstring(`"reason"="the operator's elector stopped leading"`)))
		Expect(logs.messages()).NotTo(ContainElement("Shutdown delay over"))
		expectNoLeaks(cur)
	})
})
