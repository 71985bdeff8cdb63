package suite_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/runnable"
)

var _ = Describe("A rolling update", func() {
	It("should fail readiness on a standby as soon as its stop begins, and keep it serving for the delay", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		candidate := func() (manager.Manager, *runnable.Runnable) {
			mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 5 * time.Second, ShutdownDelay: 2 * time.Second}, inNamespace(ns), func(o *manager.Options) {
				o.LeaderElection = true
				o.LeaderElectionID = "quiesce-rollout-spec"
				o.LeaderElectionNamespace = ns
				o.LeaderElectionReleaseOnCancel = true
				o.LeaseDuration = ptr.To(4 * time.Second)
				o.RenewDeadline = ptr.To(3 * time.Second)
				o.RetryPeriod = ptr.To(200 * time.Millisecond)
				o.GracefulShutdownTimeout = ptr.To(20 * time.Second)
			})
			Expect(err).NotTo(HaveOccurred())
			return mgr, q
		}
		leader, ql := candidate()
		stopLeader, leaderDone := startManager(leader, ql)
		Eventually(leader.Elected(), 10*time.Second).Should(BeClosed())
		standby, qs := candidate()
		stopStandby, standbyDone := startManager(standby, qs)
		Consistently(standby.Elected(), time.Second).ShouldNot(BeClosed(), "the second manager is a standby")
		Expect(qs.ReadyzCheck(nil)).To(Succeed())

		By("stopping the standby")
		begin := time.Now()
		stopStandby()
		Eventually(func() error { return qs.ReadyzCheck(nil) }, time.Second, 10*time.Millisecond).Should(HaveOccurred(),
			"readiness fails at once on a standby, whose Runnable (leader election) never started")
		Expect(qs.Done()).NotTo(BeClosed(), "the standby keeps serving during the delay")
		Eventually(standbyDone, 20*time.Second).Should(Receive(BeNil()))
		Expect(time.Since(begin)).To(BeNumerically(">=", 2*time.Second), "the standby stopped after the delay")
		Expect(qs.Done()).To(BeClosed(), "the stop procedure drained the standby's executor")
		Expect(qs.Err()).NotTo(HaveOccurred())
		Expect(ql.ReadyzCheck(nil)).To(Succeed(), "the leader is not affected")

		stopLeader()
		Eventually(leaderDone, 20*time.Second).Should(Receive(BeNil()))
		Expect(ql.Err()).NotTo(HaveOccurred())
		expectNoLeaks(cur)
	})

	It("should keep serving webhooks through the delay and the drain, finishing a request in flight with a live context", func() {
		cur := goleak.IgnoreCurrent()
		certs := &envtest.WebhookInstallOptions{}
		Expect(certs.PrepWithoutInstalling()).To(Succeed())
		DeferCleanup(certs.Cleanup)
		addr := net.JoinHostPort(certs.LocalServingHost, strconv.Itoa(certs.LocalServingPort))

		ws := webhook.NewServer(webhook.Options{
			Host: certs.LocalServingHost, Port: certs.LocalServingPort, CertDir: certs.LocalServingCertDir,
		})
		mgr, q, err := newQuiesced(runnable.Options{GracePeriod: 10 * time.Second, ShutdownDelay: 2 * time.Second}, func(o *manager.Options) {
			o.WebhookServer = ws
			o.GracefulShutdownTimeout = ptr.To(20 * time.Second)
		})
		Expect(err).NotTo(HaveOccurred())

		release, releaseAll := releaser()
		handlerCtxErr := make(chan error, 1)
		mgr.GetWebhookServer().Register("/validate", &webhook.Admission{Handler: admission.HandlerFunc(
			func(ctx context.Context, req admission.Request) admission.Response {
				if req.Name == "slow" {
					<-release
					handlerCtxErr <- ctx.Err()
				}
				return admission.Allowed("")
			})})
		stop, done := startManager(mgr, q)

		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM(certs.LocalServingCAData)).To(BeTrue())
		// HTTP/1.1 (no ForceAttemptHTTP2), a connection per request, as after a Service switch.
		post := func(name string) (*http.Response, error) {
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
			body := fmt.Sprintf(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u-%s",`+
				`"kind":{"group":"","version":"v1","kind":"ConfigMap"},"resource":{"group":"","version":"v1","resource":"configmaps"},`+
				`"namespace":"ns","name":%q,"operation":"CREATE","userInfo":{},"object":{"metadata":{"name":%q}}}}`, name, name, name)
			resp, err := c.Post("https://"+addr+"/validate", "application/json", bytes.NewBufferString(body))
			c.CloseIdleConnections()
			return resp, err
		}
		Eventually(func() error {
			resp, err := post("ready")
			if err == nil {
				_ = resp.Body.Close()
			}
			return err
		}, 10*time.Second, 50*time.Millisecond).Should(Succeed())

		By("sending a request that runs through the stop")
		slow := make(chan *http.Response, 1)
		go func() {
			defer GinkgoRecover()
			resp, err := post("slow")
			Expect(err).NotTo(HaveOccurred())
			slow <- resp
		}()
		Eventually(func() []drain.Pending { return q.Executor().Pending() }).Should(ContainElement(
			HaveField("Name", "webhook/validate/ns/slow")))

		By("stopping the manager")
		stop()
		Eventually(func() error { return q.ReadyzCheck(nil) }, time.Second, 10*time.Millisecond).Should(HaveOccurred())
		resp, err := post("during-delay")
		Expect(err).NotTo(HaveOccurred(), "the webhook server keeps serving during the delay")
		Expect(resp.Body.Close()).To(Succeed())
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(resp.Close).To(BeTrue(), "responses during the delay carry Connection: close")

		By("draining after the delay, while the webhooks still serve")
		Eventually(q.Executor().Draining(), 10*time.Second).Should(BeClosed())
		resp, err = post("during-drain")
		Expect(err).NotTo(HaveOccurred(), "the webhook server serves until the drain is over (webhooks stop last)")
		Expect(resp.Body.Close()).To(Succeed())
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(done).NotTo(Receive(), "the manager waits for the request in flight")

		releaseAll()
		Eventually(handlerCtxErr).Should(Receive(BeNil()), "the request in flight kept a live context")
		var r *http.Response
		Eventually(slow).Should(Receive(&r))
		Expect(r.Body.Close()).To(Succeed())
		Expect(r.StatusCode).To(Equal(http.StatusOK))
		Eventually(done, 20*time.Second).Should(Receive(BeNil()))
		Expect(q.Err()).NotTo(HaveOccurred())
		expectNoLeaks(cur)
	})

	It("should refuse bad options at Setup, naming the value to change", func() {
		_, _, err := newQuiesced(runnable.Options{ShutdownDelay: -time.Second})
		Expect(err).To(MatchError(ContainSubstring("ShutdownDelay is -1s")))
		_, _, err = newQuiesced(runnable.Options{GracePeriod: 30 * time.Second})
		Expect(err).To(MatchError(ContainSubstring("raise the manager's GracefulShutdownTimeout above 30s")))
		_, _, err = newQuiesced(runnable.Options{GracePeriod: 10 * time.Second, CancelAfter: 12 * time.Second})
		Expect(err).To(MatchError(ContainSubstring("CancelAfter (12s) must be below GracePeriod (10s)")))
		mgr, q, err := newQuiesced(runnable.Options{})
		Expect(err).NotTo(HaveOccurred())
		Expect(q.Add(mgr)).To(MatchError(ContainSubstring("call q.Add(mgr) once")))
	})
})
