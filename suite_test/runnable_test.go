package suite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/internal/metricstest"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// logLines captures log lines as funcr renders them, and echoes them to GinkgoWriter.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
		_, _ = fmt.Fprintln(GinkgoWriter, prefix, args)
	}, funcr.Options{})
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// messages returns each line's message, in order.
func (l *logLines) messages() []string {
	lines := l.all()
	out := make([]string, 0, len(lines))
	for _, line := range lines {
		_, rest, _ := strings.Cut(line, `"msg"="`)
		msg, _, _ := strings.Cut(rest, `"`)
		out = append(out, msg)
	}
	return out
}

// configMap creates a ConfigMap and returns its key.
func configMap(ctx context.Context, ns, name string) types.NamespacedName {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
	return types.NamespacedName{Namespace: ns, Name: name}
}

// lineBelow returns "file.go:line" of the line n lines below its caller's.
func lineBelow(n int) string {
	_, file, line, _ := runtime.Caller(1)
	return file[strings.LastIndexByte(file, '/')+1:] + ":" + strconv.Itoa(line+n)
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr() string {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	addr := l.Addr().String()
	Expect(l.Close()).To(Succeed())
	return addr
}

func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url) //nolint:noctx // a test's loopback probe
	if err != nil {
		return 0, "", err
	}
	body, err := io.ReadAll(resp.Body)
	if closeErr := resp.Body.Close(); err == nil {
		err = closeErr
	}
	return resp.StatusCode, string(body), err
}

// metricValue reads one sample ("name" or `name{label="v"}`) from a scrape.
func metricValue(scrape, sample string) float64 {
	GinkgoHelper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(scrape)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	Expect(err).NotTo(HaveOccurred())
	return v
}

// gathered reads one sample from controller-runtime's metrics.Registry directly.
func gathered(name string) float64 {
	GinkgoHelper()
	return metricstest.Value(GinkgoT(), name, nil)
}

var _ = Describe("runnable.Runnable in a manager", func() {
	It("should let an in-flight reconcile finish with a live context when the manager stops", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		mgr, q, err := newQuiesced(runnable.Options{
			CancelAfter: 10 * time.Second,
			GracePeriod: 15 * time.Second,
		}, inNamespace(ns))
		Expect(err).NotTo(HaveOccurred())

		started := make(chan struct{}, 1)
		var ctxErrAtEnd error
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("slow").
			Complete(reconcilers.Wrap(q.Executor(), "slow", reconcile.Func(
				func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
					if req.Namespace != ns {
						return reconcile.Result{}, nil
					}
					started <- struct{}{}
					time.Sleep(3 * time.Second) // the reconcile's work, at real time on a real server
					ctxErrAtEnd = ctx.Err()
					var cm corev1.ConfigMap
					if err := mgr.GetClient().Get(ctx, req.NamespacedName, &cm); err != nil {
						return reconcile.Result{}, err
					}
					patch := client.MergeFrom(cm.DeepCopy())
					cm.Annotations = map[string]string{"quiesce.dev/finished": "true"}
					return reconcile.Result{}, mgr.GetClient().Patch(ctx, &cm, patch)
				}), reconcilers.WrapOptions{}))).To(Succeed())
		stop, done := startManager(mgr)
		key := configMap(ctx, ns, "slow")

		Eventually(started).Should(Receive())
		By("stopping the manager mid-reconcile, as SIGTERM would")
		stop()
		Eventually(done, 20*time.Second).Should(Receive(BeNil()), "mgr.Start returns nil")
		Expect(ctxErrAtEnd).NotTo(HaveOccurred(), "the reconcile's context was live at its end")
		Expect(q.Err()).NotTo(HaveOccurred())

		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, key, &cm)).To(Succeed())
		Expect(cm.Annotations).To(HaveKeyWithValue("quiesce.dev/finished", "true"))
		draintest.VerifyNone(GinkgoT(), q.Executor())
		expectNoLeaks(cur)
	})

	It("should report a hanging handler while it waits and name it when the grace period ends", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		var logs logLines
		mgr, q, err := newQuiesced(runnable.Options{
			Logger: logs.logger(), ReportAfter: 500 * time.Millisecond, ReportEvery: time.Second,
			GracePeriod: 3 * time.Second,
			// At once: the reconcile returns and only the executor waits for the call (detached).
			CancelAfter: drain.CancelAtOnce,
		}, inNamespace(ns), func(o *manager.Options) { o.GracefulShutdownTimeout = ptr.To(30 * time.Second) })
		Expect(err).NotTo(HaveOccurred())

		hold, release := releaser()
		handlerStarted := make(chan struct{}, 1)
		var blockedAt string
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("hang").
			Complete(reconcilers.Wrap(q.Executor(), "hang", reconcile.Func(
				func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
					if req.Namespace != ns {
						return reconcile.Result{}, nil
					}
					return reconcile.Result{}, reconcilers.Call(ctx, "upload", func(context.Context) error {
						blockedAt = lineBelow(2)
						handlerStarted <- struct{}{}
						<-hold // a blocking call that ignores its context
						return nil
					})
				}), reconcilers.WrapOptions{}))).To(Succeed())
		stop, done := startManager(mgr)
		configMap(ctx, ns, "stuck")
		Eventually(handlerStarted).Should(Receive())

		By("stopping the manager while the handler hangs")
		stopped := time.Now()
		stop()
		var startErr error
		Eventually(done, 20*time.Second).Should(Receive(&startErr))
		took := time.Since(stopped)
		Expect(startErr).NotTo(HaveOccurred(), "controller-runtime does not return a runnable's error once stopping")
		Expect(took).To(BeNumerically("<", 15*time.Second), "mgr.Start returns soon after the grace period, not after GracefulShutdownTimeout")

		name := "hang/" + ns + "/stuck/upload"
		var pe *drain.PendingError
		Expect(errors.As(q.Err(), &pe)).To(BeTrue(), "main learns that calls were abandoned: %v", q.Err())
		Expect(pe.Pending).To(ConsistOf(HaveField("Name", name)))
		Expect(q.Err().Error()).NotTo(ContainSubstring(name), "the error counts the calls; the log line lists them")

		msgs := logs.messages()
		Expect(msgs[:2]).To(Equal(stopBegins()))
		Expect(msgs[2]).To(Equal("Cancelling calls still running"), "CancelAtOnce: the drain names what it cancels")
		Expect(msgs[len(msgs)-1]).To(Equal("Abandoned calls still running after the grace period"))
		reports := msgs[3 : len(msgs)-1]
		Expect(len(reports)).To(BeNumerically(">=", 2), "a report at 0.5s, then every second until 3s")
		Expect(reports).To(HaveEach("Waiting for pending calls"))
		lines := logs.all()
		Expect(lines[2]).To(ContainSubstring(`"cancelled"=2`))
		for _, report := range lines[3 : len(lines)-1] {
			Expect(report).To(ContainSubstring(`"name"="` + name + `"`))
			Expect(report).To(ContainSubstring(`"detached"=true`))
			Expect(report).To(ContainSubstring(blockedAt))
			Expect(report).To(MatchRegexp(`"age"="\d+(ms|s)"`))
		}
		Expect(lines[len(lines)-1]).To(ContainSubstring(`"abandoned"=1`))
		Expect(lines[len(lines)-1]).To(ContainSubstring(`"name"="` + name + `"`))
		Expect(lines[len(lines)-1]).To(ContainSubstring(blockedAt))

		release()
		Eventually(q).Should(draintest.HaveNoPendingCalls())
		expectNoLeaks(cur)
	})

	It("should log no report when nothing is pending at stop", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		var logs logLines
		mgr, q, err := newQuiesced(runnable.Options{Logger: logs.logger(), ReportAfter: drain.MinReportAfter}, inNamespace(ns))
		Expect(err).NotTo(HaveOccurred())
		reconciled := make(chan struct{}, 1)
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("quiet").
			Complete(reconcilers.Wrap(q.Executor(), "quiet", reconcile.Func(
				func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
					if req.Namespace == ns {
						reconciled <- struct{}{}
					}
					return reconcile.Result{}, nil
				}), reconcilers.WrapOptions{}))).To(Succeed())
		stop, done := startManager(mgr)
		configMap(ctx, ns, "quiet")
		Eventually(reconciled).Should(Receive())
		stop()
		Eventually(done).Should(Receive(BeNil()))
		Expect(q.Err()).NotTo(HaveOccurred())
		Expect(logs.all()).To(BeEmpty())
		draintest.VerifyNone(GinkgoT(), q.Executor())
		expectNoLeaks(cur)
	})

	It("should stay ready through a drain without ShutdownDelay, and export metrics that match the calls", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		probeAddr, metricsAddr, debugAddr := freeAddr(), freeAddr(), freeAddr()
		// The spec reads /debug/quiesce over plain HTTP, on the loopback listener of DebugAddress.
		mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 2 * time.Second, DebugAddress: debugAddr}, inNamespace(ns), func(o *manager.Options) {
			o.HealthProbeBindAddress = probeAddr
			o.Metrics = metricsserver.Options{BindAddress: metricsAddr}
		})
		Expect(err).NotTo(HaveOccurred())

		hold, release := releaser()
		hanging := make(chan struct{}, 1)
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("metered").
			Complete(reconcilers.Wrap(q.Executor(), "metered", reconcile.Func(
				func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
					if req.Namespace != ns {
						return reconcile.Result{}, nil
					}
					if err := reconcilers.Call(ctx, "quick", func(context.Context) error { return nil }); err != nil {
						return reconcile.Result{}, err
					}
					return reconcile.Result{}, reconcilers.Call(ctx, "hang", func(context.Context) error {
						hanging <- struct{}{}
						<-hold
						return nil
					})
				}), reconcilers.WrapOptions{}))).To(Succeed())
		stop, done := startManager(mgr)

		readyz := "http://" + probeAddr + "/readyz"
		Eventually(func() (int, error) { code, _, err := httpGet(readyz); return code, err }).Should(Equal(http.StatusOK))
		scrape := func() string {
			GinkgoHelper()
			code, body, err := httpGet("http://" + metricsAddr + "/metrics")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(http.StatusOK))
			return body
		}
		before := scrape()
		abandonedBefore := gathered("quiesce_calls_abandoned_total")
		drainsBefore := gathered("quiesce_drain_duration_seconds")

		configMap(ctx, ns, "metered")
		Eventually(hanging).Should(Receive())
		during := scrape()
		Expect(metricValue(during, "quiesce_calls_started_total")-metricValue(before, "quiesce_calls_started_total")).
			To(BeEquivalentTo(3), "the reconcile and its two handler calls")
		Expect(metricValue(during, "quiesce_calls_in_flight")).To(BeEquivalentTo(2), "the reconcile and the hanging call")
		Expect(metricValue(during, `quiesce_call_duration_seconds_count{controller="metered"}`)-
			metricValue(before, `quiesce_call_duration_seconds_count{controller="metered"}`)).To(BeEquivalentTo(1), "the quick call ended")
		Expect(metricValue(during, "quiesce_oldest_call_age_seconds")).To(BeNumerically(">", 0))

		By("listing the pending calls at /debug/quiesce, on the metrics server")
		debugCode, debugBody, err := httpGet("http://" + debugAddr + "/debug/quiesce?limit=1")
		Expect(err).NotTo(HaveOccurred())
		Expect(debugCode).To(Equal(http.StatusOK))
		var debug struct {
			Draining bool
			Count    int
			Calls    []struct{ Name, Handler string }
		}
		Expect(json.Unmarshal([]byte(debugBody), &debug)).To(Succeed())
		Expect(debug.Draining).To(BeFalse())
		Expect(debug.Count).To(Equal(2), "the reconcile and the hanging call")
		Expect(debug.Calls).To(ConsistOf(HaveField("Name", "metered/"+ns+"/metered")), "the oldest: the reconcile")
		Expect(debug.Calls[0].Handler).To(ContainSubstring("runnable_test.go:"), "the line in the reconciler where it waits")

		By("stopping the manager: with no ShutdownDelay, readyz stays ready while the drain waits for the hanging call")
		stop()
		Eventually(q.Executor().Draining()).Should(BeClosed())
		code, body, err := httpGet(readyz + "?verbose=true")
		Expect(err).NotTo(HaveOccurred())
		Expect(code).To(Equal(http.StatusOK), "a single replica stays in its Service until its webhooks stop")
		Expect(body).To(ContainSubstring("[+]quiesce ok"))

		Eventually(done, 10*time.Second).Should(Receive(BeNil()))
		Expect(gathered("quiesce_calls_abandoned_total") - abandonedBefore).To(BeEquivalentTo(1))
		Expect(gathered("quiesce_drain_duration_seconds") - drainsBefore).To(BeEquivalentTo(1))

		release()
		Eventually(q).Should(draintest.HaveNoPendingCalls())
		expectNoLeaks(cur)
	})
})

var _ = Describe("Runnable.Add", func() {
	It("should refuse a manager that already stopped, with a clear error", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		opts := managerOptions(inNamespace(ns))
		q, err := runnable.Setup(cfg, &opts, runnable.Options{})
		Expect(err).NotTo(HaveOccurred())
		mgr, err := ctrl.NewManager(cfg, opts)
		Expect(err).NotTo(HaveOccurred())
		stop, done := startManager(mgr)
		stop()
		Eventually(done).Should(Receive(BeNil()))

		err = q.Add(mgr)
		Expect(err).To(MatchError(ContainSubstring("failed to add quiesce")))
		expectNoLeaks(cur)
	})
})
