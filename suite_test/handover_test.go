package suite_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

var _ = Describe("A rolling update of three replicas", func() {
	It("should never hand the lease to a replica whose stop began", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		replica := func() (manager.Manager, *runnable.Runnable) {
			mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 5 * time.Second, ShutdownDelay: 2 * time.Second}, inNamespace(ns), func(o *manager.Options) {
				o.LeaderElection = true
				o.LeaderElectionID = "quiesce-handover"
				o.LeaderElectionNamespace = ns
				o.LeaderElectionReleaseOnCancel = true
				o.LeaseDuration = ptr.To(3 * time.Second)
				o.RenewDeadline = ptr.To(2 * time.Second)
				o.RetryPeriod = ptr.To(100 * time.Millisecond)
				o.GracefulShutdownTimeout = ptr.To(10 * time.Second)
			})
			Expect(err).NotTo(HaveOccurred())
			return mgr, q
		}
		leader, ql := replica()
		stopLeader, leaderDone := startManager(leader, ql)
		Eventually(leader.Elected(), 15*time.Second).Should(BeClosed())
		old, qo := replica() // the old standby, stopped first
		stopOld, oldDone := startManager(old, qo)
		fresh, qf := replica() // the new replica of the rollout
		stopFresh, freshDone := startManager(fresh, qf)
		Consistently(old.Elected(), 500*time.Millisecond).ShouldNot(BeClosed())

		By("stopping the old standby, then the leader 0.2s into the standby's delay")
		stopOld()
		time.Sleep(200 * time.Millisecond)
		stopLeader()
		var err error
		Eventually(leaderDone, 15*time.Second).Should(Receive(&err))
		Expect(err).NotTo(HaveOccurred())
		released := time.Now()
		Eventually(fresh.Elected(), 10*time.Second).Should(BeClosed(), "the new replica takes the released lease")
		handover := time.Since(released)
		Expect(old.Elected()).NotTo(BeClosed(), "the stopping standby never acquired the lease")
		_, _ = fmt.Fprintf(GinkgoWriter, "handover | from the leader's exit to the new replica's election: %v\n", handover)
		Expect(handover).To(BeNumerically("<", 3*time.Second), "no wait for the lease to expire")

		Eventually(oldDone, 15*time.Second).Should(Receive(&err))
		Expect(err).NotTo(HaveOccurred())
		Expect(old.Elected()).NotTo(BeClosed(), "not even at the end of its stop")
		stopFresh()
		Eventually(freshDone, 15*time.Second).Should(Receive(&err))
		Expect(err).NotTo(HaveOccurred())
		for _, q := range []*runnable.Runnable{ql, qo, qf} {
			Expect(q.Err()).NotTo(HaveOccurred())
		}
		expectNoLeaks(cur)
	})
})

// blackhole is a TCP proxy in front of the API server that, once holed, forwards nothing
// more: requests hang as on an API server that stops answering.
type blackhole struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	holed  bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newBlackhole(target string) *blackhole {
	GinkgoHelper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	b := &blackhole{ln: ln, target: target}
	b.wg.Add(1)
	go b.serve()
	DeferCleanup(b.close)
	return b
}

func (b *blackhole) serve() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, c, up)
		b.mu.Unlock()
		b.wg.Add(2)
		go b.pipe(up, c)
		go b.pipe(c, up)
	}
}

// pipe copies src to dst until src closes, dropping everything once holed.
func (b *blackhole) pipe(dst, src net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		b.mu.Lock()
		holed := b.holed
		b.mu.Unlock()
		if n > 0 && !holed {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = dst.Close()
			}
			return
		}
	}
}

func (b *blackhole) hole() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holed = true
}

// close closes the listener and every connection, and waits for the proxy's goroutines.
// Calling it again does nothing more.
func (b *blackhole) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

var _ = Describe("An API server that stops answering", func() {
	It("should not hold the stop beyond GracefulShutdownTimeout, with Events configured", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		u, err := url.Parse(cfg.Host)
		Expect(err).NotTo(HaveOccurred())
		hole := newBlackhole(u.Host)
		proxied := rest.CopyConfig(cfg)
		proxied.Host = "https://" + hole.ln.Addr().String()
		const timeout = 5 * time.Second
		mgrOpts := manager.Options{
			Scheme:                  scheme.Scheme,
			Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
			Metrics:                 metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress:  "0",
			GracefulShutdownTimeout: ptr.To(timeout),
		}
		inNamespace(ns)(&mgrOpts)
		var logs logLines
		q, err := runnable.Setup(proxied, &mgrOpts, runnable.Options{Logger: logs.logger(), GracePeriod: time.Second})
		Expect(err).NotTo(HaveOccurred())
		mgr, err := ctrl.NewManager(proxied, mgrOpts)
		Expect(err).NotTo(HaveOccurred())
		Expect(q.Add(mgr)).To(Succeed())
		hold, release := releaser()
		stuck := make(chan struct{}, 1)
		rec, stopRecorder := newRecorder("blackholed")
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("blackholed").Complete(reconcilers.Wrap(q.Executor(), "blackholed", reconcile.Func(
			func(context.Context, reconcile.Request) (reconcile.Result, error) {
				stuck <- struct{}{}
				<-hold // ignores its context: abandoned
				return reconcile.Result{}, nil
			}), reconcilers.WrapOptions{Recorder: rec, Reader: mgr.GetAPIReader(), Object: &corev1.ConfigMap{}}))).To(Succeed())
		stop, done := startManager(mgr)
		configMap(ctx, ns, "work")
		Eventually(stuck, 10*time.Second).Should(Receive())

		By("the API server stops answering, then the stop begins")
		hole.hole()
		begin := time.Now()
		stop()
		// quiesce's part: the grace period, then the Events' budget (half of what is left
		// before GracefulShutdownTimeout), whatever the API server does.
		Eventually(q.Done(), timeout).Should(BeClosed(), "the Runnable's stop is over before the manager gives up")
		drained := time.Since(begin)
		Expect(q.Err()).To(HaveOccurred())
		// The manager's: the stuck reconcile holds controller-runtime's worker until
		// GracefulShutdownTimeout, as it does without quiesce.
		Eventually(done, timeout+5*time.Second).Should(Receive())
		took := time.Since(begin)
		_, _ = fmt.Fprintf(GinkgoWriter, "blackhole | quiesce's stop over %v after the stop, mgr.Start returned after %v (GracefulShutdownTimeout %v)\n",
			drained, took, timeout)
		Expect(took).To(BeNumerically("<", timeout+time.Second))
		Expect(logs.all()).To(ContainElement(And(
			ContainSubstring("Abandoned calls still running after the grace period"),
			ContainSubstring("blackholed/"+ns+"/work"))))
		release()
		stopRecorder()
		hole.close()
		expectNoLeaks(cur)
	})
})
