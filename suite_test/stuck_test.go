package suite_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// debugState is the body of /debug/quiesce.
type debugState struct {
	Draining bool
	Count    int
	Calls    []struct{ Name, Where, Handler string }
}

var _ = Describe("A stuck reconcile", func() {
	It("should be logged as slow with its location, listed at /debug/quiesce and shown by the age metric, before any shutdown",
		func(ctx SpecContext) {
			cur := goleak.IgnoreCurrent()
			ns := newNamespace(ctx)
			metricsAddr, debugAddr := freeAddr(), freeAddr()
			var logs logLines
			mgr, q, err := newQuiesced(runnable.Options{
				Logger: logs.logger(), SlowAfter: time.Second, ReportEvery: time.Second,
				DebugAddress: debugAddr, // the spec reads /debug/quiesce over plain HTTP, on loopback
			}, inNamespace(ns), func(o *manager.Options) {
				o.Metrics = metricsserver.Options{BindAddress: metricsAddr}
			})
			Expect(err).NotTo(HaveOccurred())
			hold, release := releaser()
			stuck := make(chan struct{}, 1)
			var blockedAt string
			Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("stuck").
				Complete(reconcilers.Wrap(q.Executor(), "stuck", reconcile.Func(
					func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
						if req.Namespace != ns {
							return reconcile.Result{}, nil
						}
						blockedAt = lineBelow(2)
						stuck <- struct{}{}
						<-hold // a call that ignores its context, inline in the reconcile
						return reconcile.Result{}, nil
					}), reconcilers.WrapOptions{}))).To(Succeed())
			stop, done := startManager(mgr)
			configMap(ctx, ns, "cm")
			Eventually(stuck).Should(Receive())
			name := "stuck/" + ns + "/cm"

			By("logging it as slow once it runs longer than SlowAfter")
			Eventually(logs.messages, 10*time.Second).Should(ContainElement("Slow calls"))
			var slowLine string
			for _, line := range logs.all() {
				if strings.Contains(line, `"msg"="Slow calls"`) {
					slowLine = line
				}
			}
			Expect(slowLine).To(ContainSubstring(`"name"="` + name + `"`))
			Expect(slowLine).To(ContainSubstring(`"where"="suite_test.init.`))
			Expect(slowLine).To(ContainSubstring(blockedAt))
			Expect(slowLine).To(ContainSubstring(`"slow"=1`))

			By("listing it at /debug/quiesce, with the reconciler's own line")
			code, body, err := httpGet("http://" + debugAddr + "/debug/quiesce")
			Expect(err).NotTo(HaveOccurred())
			Expect(code).To(Equal(http.StatusOK))
			_, _ = fmt.Fprintln(GinkgoWriter, "GET /debug/quiesce:", body)
			var state debugState
			Expect(json.Unmarshal([]byte(body), &state)).To(Succeed())
			Expect(state.Draining).To(BeFalse())
			Expect(state.Count).To(Equal(1))
			Expect(state.Calls).To(HaveLen(1))
			Expect(state.Calls[0].Name).To(Equal(name))
			Expect(state.Calls[0].Where).To(HaveSuffix(blockedAt + ")"))
			Expect(state.Calls[0].Handler).To(HaveSuffix(blockedAt + ")"))

			By("showing it in the metrics")
			_, scrape, err := httpGet("http://" + metricsAddr + "/metrics")
			Expect(err).NotTo(HaveOccurred())
			for _, line := range strings.Split(scrape, "\n") {
				if strings.HasPrefix(line, "quiesce_oldest_call_age_seconds ") || strings.HasPrefix(line, "quiesce_calls_slow ") {
					_, _ = fmt.Fprintln(GinkgoWriter, "metric:", line)
				}
			}
			Expect(metricValue(scrape, "quiesce_oldest_call_age_seconds")).To(BeNumerically(">=", 1))
			Expect(metricValue(scrape, "quiesce_calls_slow")).To(BeEquivalentTo(1))
			Expect(logs.messages()).NotTo(ContainElement("Draining executor"), "all of this before any shutdown")

			release()
			Eventually(q).Should(draintest.HaveNoPendingCalls())
			stop()
			Eventually(done, 20*time.Second).Should(Receive(BeNil()))
			expectNoLeaks(cur)
		})

	It("should be named at the grace period, while mgr.Start returns only at GracefulShutdownTimeout", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		var logs logLines
		mgr, q, err := newQuiesced(runnable.Options{
			ReportAfter: 500 * time.Millisecond, ReportEvery: time.Second,
			GracePeriod: 2 * time.Second,
		}, inNamespace(ns), func(o *manager.Options) {
			o.Logger = logs.logger()
			o.GracefulShutdownTimeout = ptr.To(5 * time.Second)
		})
		Expect(err).NotTo(HaveOccurred())
		hold, release := releaser()
		stuck := make(chan struct{}, 1)
		var blockedAt string
		Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("inline").
			Complete(reconcilers.Wrap(q.Executor(), "inline", reconcile.Func(
				func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
					if req.Namespace != ns {
						return reconcile.Result{}, nil
					}
					blockedAt = lineBelow(2)
					stuck <- struct{}{}
					<-hold // ignores its context, on controller-runtime's worker
					return reconcile.Result{}, nil
				}), reconcilers.WrapOptions{}))).To(Succeed())
		stop, done := startManager(mgr)
		configMap(ctx, ns, "cm")
		Eventually(stuck).Should(Receive())

		stopped := time.Now()
		stop()
		var startErr error
		Eventually(done, 20*time.Second).Should(Receive(&startErr))
		took := time.Since(stopped)
		atReturn := logs.messages()

		By("naming the reconcile at the grace period")
		Expect(atReturn).To(ContainElement("Abandoned calls still running after the grace period"))
		Expect(q.Err()).To(HaveOccurred())
		var abandoned string
		for _, line := range logs.all() {
			if strings.Contains(line, "Abandoned calls") {
				abandoned = line
			}
		}
		Expect(abandoned).To(ContainSubstring(`"name"="inline/` + ns + `/cm"`))
		Expect(abandoned).To(ContainSubstring(blockedAt))

		By("mgr.Start returning only when the manager gives up on its worker")
		Expect(startErr).To(MatchError(ContainSubstring("failed waiting for all runnables to end within grace period of 5s")))
		Expect(took).To(BeNumerically(">=", 5*time.Second))
		Expect(took).To(BeNumerically("<", 15*time.Second))

		By("logging in this order: the drain in the first group, then the controller's stop")
		Expect(atReturn).To(ContainElements(
			"Stopping and waiting for non leader election runnables",
			"Draining executor",
			"Waiting for pending calls",
			"Abandoned calls still running after the grace period",
			"Stopping and waiting for leader election runnables",
		))
		Expect(indexOf(atReturn, "Stopping and waiting for non leader election runnables")).
			To(BeNumerically("<", indexOf(atReturn, "Draining executor")))
		Expect(indexOf(atReturn, "Draining executor")).To(BeNumerically("<", indexOf(atReturn, "Waiting for pending calls")))
		Expect(indexOf(atReturn, "Waiting for pending calls")).
			To(BeNumerically("<", indexOf(atReturn, "Abandoned calls still running after the grace period")))
		Expect(indexOf(atReturn, "Abandoned calls still running after the grace period")).
			To(BeNumerically("<", indexOf(atReturn, "Stopping and waiting for leader election runnables")))
		Expect(atReturn).To(ContainElement("Shutdown signal received, waiting for all workers to finish"))
		Expect(atReturn).NotTo(ContainElement("All workers finished"), "the worker is still held: the manager gave up on it")

		release()
		Eventually(q).Should(draintest.HaveNoPendingCalls())
		expectNoLeaks(cur)
	})
})

var _ = Describe("/debug/quiesce", func() {
	It("should be refused without credentials when the metrics server has a FilterProvider", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		metricsAddr := freeAddr()
		mgr, _, err := newQuiesced(runnable.Options{}, inNamespace(ns), func(o *manager.Options) {
			o.Metrics = metricsserver.Options{
				BindAddress:    metricsAddr,
				SecureServing:  true,
				FilterProvider: bearerTokenFilter,
			}
		})
		Expect(err).NotTo(HaveOccurred())
		stop, done := startManager(mgr)

		httpClient := &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the server's self-signed test certificate
		}}
		defer httpClient.CloseIdleConnections()
		get := func(path string, authorization ...string) (int, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+metricsAddr+path, nil)
			if err != nil {
				return 0, err
			}
			for _, a := range authorization {
				req.Header.Set("Authorization", a)
			}
			resp, err := httpClient.Do(req)
			if err != nil {
				return 0, err
			}
			return resp.StatusCode, resp.Body.Close()
		}
		Eventually(func() (int, error) { return get("/metrics") }).Should(Equal(http.StatusUnauthorized))
		Expect(get("/debug/quiesce")).To(Equal(http.StatusUnauthorized), "behind the same filter as /metrics")
		Expect(get("/debug/quiesce", "Bearer token")).To(Equal(http.StatusOK), "and served through it")

		stop()
		Eventually(done, 20*time.Second).Should(Receive(BeNil()))
		httpClient.CloseIdleConnections()
		expectNoLeaks(cur)
	})
})

// bearerTokenFilter is a metricsserver.FilterProvider that refuses requests without a
// bearer token (401), as kubebuilder's filters.WithAuthenticationAndAuthorization does
// before it asks the API server about the token. That filter would pull k8s.io/apiserver and
// ~25 more modules into quiesce's go.mod for one spec; what the spec checks is that the
// metrics server puts /debug/quiesce behind whatever filter it has.
func bearerTokenFilter(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	return func(_ logr.Logger, next http.Handler) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if !strings.HasPrefix(req.Header.Get("Authorization"), "Bearer ") {
				http.Error(w, "Unauthorized", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, req)
		}), nil
	}, nil
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
