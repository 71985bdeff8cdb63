package suite_test

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// stuckRun is what one stop of a manager whose reconcile hangs, ignoring its context, gave.
type stuckRun struct {
	startErr error
	took     time.Duration
	logs     *logLines
	q        *runnable.Runnable // nil for plain controller-runtime
	ns       string
}

// runStuck runs a controller that needs no leader election, whose reconcile hangs on
// controller-runtime's worker ignoring its context, and stops the manager mid-reconcile.
func runStuck(ctx context.Context, withQuiesce bool) stuckRun {
	GinkgoHelper()
	run := stuckRun{ns: newNamespace(ctx), logs: &logLines{}}
	mutate := func(o *manager.Options) {
		o.Logger = run.logs.logger()
		o.GracefulShutdownTimeout = ptr.To(4 * time.Second)
	}
	var mgr manager.Manager
	if withQuiesce {
		var err error
		mgr, run.q, err = newQuiesced(runnable.Options{GracePeriod: 2 * time.Second,
			ReportAfter: 500 * time.Millisecond, ReportEvery: time.Second}, inNamespace(run.ns), mutate)
		Expect(err).NotTo(HaveOccurred())
	} else {
		mgr = newManager(inNamespace(run.ns), mutate)
	}
	hold, release := releaser()
	stuck := make(chan struct{}, 1)
	var r reconcile.Reconciler = reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		if req.Namespace != run.ns {
			return reconcile.Result{}, nil
		}
		stuck <- struct{}{}
		<-hold // ignores its context
		return reconcile.Result{}, nil
	})
	if withQuiesce {
		r = reconcilers.Wrap(run.q.Executor(), "inline", r, reconcilers.WrapOptions{})
	}
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("inline").
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false)}).Complete(r)).To(Succeed())
	stop, done := startManager(mgr)
	configMap(ctx, run.ns, "cm")
	Eventually(stuck).Should(Receive())
	begin := time.Now()
	stop()
	Eventually(done, 20*time.Second).Should(Receive(&run.startErr))
	run.took = time.Since(begin)
	release() // the worker ends, after mgr.Start returned
	return run
}

var _ = Describe("A stuck reconcile of a controller that needs no leader election", func() {
	It("should be named at the grace period, and stop no later than plain controller-runtime", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		plain := runStuck(ctx, false)
		withQ := runStuck(ctx, true)
		GinkgoWriter.Printf("stuck, controller LE false | quiesce: stop %.2fs, mgr.Start %s, q.Err %v | plain: stop %.2fs, mgr.Start %s\n",
			withQ.took.Seconds(), errText(withQ.startErr), withQ.q.Err() != nil, plain.took.Seconds(), errText(plain.startErr))

		By("both: controller-runtime gives up on its worker at GracefulShutdownTimeout")
		for _, run := range []stuckRun{plain, withQ} {
			Expect(run.startErr).To(MatchError(ContainSubstring("failed waiting for all runnables to end within grace period of 4s")))
			Expect(run.took).To(BeNumerically(">=", 4*time.Second))
		}
		Expect(withQ.took).To(BeNumerically("<=", plain.took+time.Second), "quiesce waits no longer than plain controller-runtime")

		By("quiesce: the hanging reconcile is named at the grace period, and q.Err says so")
		var abandoned string
		for _, line := range withQ.logs.all() {
			if strings.Contains(line, "Abandoned calls still running after the grace period") {
				abandoned = line
			}
		}
		Expect(abandoned).To(ContainSubstring(`"name"="inline/` + withQ.ns + `/cm"`))
		Expect(abandoned).To(ContainSubstring("stuck_noleader_test.go"), "where it hangs")
		Expect(withQ.q.Err()).To(HaveOccurred())
		Expect(withQ.logs.messages()).NotTo(ContainElement("Leadership lost: cancelling calls"), "a planned stop is no lease loss")
		expectNoLeaks(cur)
	})
})
