package suite_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// slowdown slows the requests of the clients made from its config: each it matches waits the
// delay set (0 at first), or its context's end, before it is sent.
type slowdown struct {
	only        func(*http.Request) bool // nil: every request
	delay       atomic.Int64             // nanoseconds
	leaseWrites atomic.Int64             // Lease writes delayed so far
}

func (s *slowdown) set(d time.Duration) { s.delay.Store(int64(d)) }

// config returns a copy of the suite's config whose clients s slows.
func (s *slowdown) config() *rest.Config {
	c := rest.CopyConfig(cfg)
	wrap := c.WrapTransport // the suite's: it records the transport for expectNoLeaks
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return slowTransport{s: s, rt: wrap(rt)}
	}
	return c
}

// leaseWrite matches the writes of Leases: claims and the leader lease.
func leaseWrite(req *http.Request) bool {
	return req.Method != http.MethodGet && strings.Contains(req.URL.Path, "/leases")
}

// claimWrite matches the writes of claims once the leader lease exists (its creation is a
// POST to the collection, as a claim's): the writes of Leases but the hand-over specs' leader lease.
func claimWrite(req *http.Request) bool {
	return leaseWrite(req) && !strings.HasSuffix(req.URL.Path, "/leases/"+handoffLease)
}

type slowTransport struct {
	s  *slowdown
	rt http.RoundTripper
}

func (t slowTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	d := time.Duration(t.s.delay.Load())
	if d <= 0 || t.s.only != nil && !t.s.only(req) {
		return t.rt.RoundTrip(req)
	}
	if leaseWrite(req) {
		t.s.leaseWrites.Add(1)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return t.rt.RoundTrip(req)
	case <-req.Context().Done():
		if req.Body != nil {
			_ = req.Body.Close() // as a RoundTripper must, even on errors
		}
		return nil, req.Context().Err()
	}
}

// The replica the suite runs in a process of its own (TestMain): replicaEnv names its
// kubeconfig, replicaNamespaceEnv its namespace.
const (
	replicaEnv          = "QUIESCE_SUITE_REPLICA_KUBECONFIG"
	replicaNamespaceEnv = "QUIESCE_SUITE_REPLICA_NAMESPACE"
)

// replicaClockSkew puts the process replica's clock, hence its claims' renewTime, an hour
// behind: a successor judging expiry from the holder's renewTime would run its object at once.
const replicaClockSkew = -time.Hour

// skewedClock is the real clock moved by skew.
type skewedClock struct {
	clock.RealClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.skew) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c skewedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// runReplica runs, in this process, replica "a" of handoffReplica's operator on the cluster
// and in the namespace the environment names, its clock replicaClockSkew off, until SIGTERM
// and its stop end: its runs never return by themselves. It logs to stdout, each run too
// ("Run started"), and returns the process's exit code.
func runReplica() int {
	RegisterFailHandler(func(msg string, _ ...int) {
		fmt.Println("Replica failed:", msg)
		os.Exit(2)
	})
	var err error
	cfg, err = clientcmd.BuildConfigFromFlags("", os.Getenv(replicaEnv))
	Expect(err).NotTo(HaveOccurred())
	logs := &logLines{}
	ctrl.SetLogger(logs.logger())
	runs := &handoffRuns{started: make(chan handoffRun, 16)}
	go func() {
		for r := range runs.started {
			logs.logger().Info("Run started", "object", r.Object)
		}
	}()
	mgr, q := handoffReplica(os.Getenv(replicaNamespaceEnv), "a", replicaOptions{releaseOnCancel: true,
		hold: make(chan struct{}), clock: skewedClock{skew: replicaClockSkew}}, runs, logs)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := mgr.Start(q.StopContext(ctx)); err != nil {
		fmt.Println("Replica failed:", err)
		return 1
	}
	return 0
}

// replicaProcess is runReplica in a process of its own, started by startReplica.
type replicaProcess struct {
	cmd    *exec.Cmd
	out    *logLines // its output lines, stdout and stderr, as they come
	killed sync.Once
}

// startReplica starts runReplica in ns, in a process running the suite's own binary as an
// admin of the suite's control plane. Should the spec fail first, its cleanup kills it.
func startReplica(ns string) *replicaProcess {
	GinkgoHelper()
	u, err := testEnv.AddUser(envtest.User{Name: "replica", Groups: []string{"system:masters"}}, cfg)
	Expect(err).NotTo(HaveOccurred())
	kc, err := u.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	path := filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(os.WriteFile(path, kc, 0o600)).To(Succeed())
	self, err := os.Executable()
	Expect(err).NotTo(HaveOccurred())
	p := &replicaProcess{cmd: exec.Command(self), out: &logLines{}}
	p.cmd.Env = append(os.Environ(), replicaEnv+"="+path, replicaNamespaceEnv+"="+ns)
	w := &lineWriter{to: p.out}
	p.cmd.Stdout, p.cmd.Stderr = w, w // one writer: exec calls it from one goroutine at a time
	Expect(p.cmd.Start()).To(Succeed())
	DeferCleanup(p.kill)
	return p
}

// kill sends SIGKILL and waits for the process and its output; idempotent.
func (p *replicaProcess) kill() {
	p.killed.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
	})
}

// logged reports whether a line of the process's output contains s.
func (p *replicaProcess) logged(s string) func() bool {
	return func() bool { return hasLine(p.out.all(), s) }
}

// lineWriter appends what is written to it to a logLines, a line at a time (of any length),
// and to GinkgoWriter.
type lineWriter struct {
	to   *logLines
	part []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.part = append(w.part, p...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.part[:i])
		w.part = w.part[i+1:]
		w.to.mu.Lock()
		w.to.lines = append(w.to.lines, line)
		w.to.mu.Unlock()
		_, _ = fmt.Fprintln(GinkgoWriter, "replica:", line)
	}
}

var _ = Describe("HandOffAtStop, a holder killed", func() {
	It("should run the object of a holder SIGKILLed mid-work after the hand-over one claim duration after the successor first saw its claim, by the successor's own clock, never while the holder lived",
		func(ctx SpecContext) {
			cur := goleak.IgnoreCurrent()
			ns := newNamespace(ctx)
			configMap(ctx, ns, "x")
			By("running the leader in a process of its own, its clock an hour behind, mid-reconcile on x")
			a := startReplica(ns)
			Eventually(a.logged(`"msg"="Run started" "object"="x"`), time.Minute).Should(BeTrue())
			holder := leaseHolder(ctx, ns)
			Expect(holder).NotTo(BeEmpty())

			By("starting the successor b as a standby, before the claim exists")
			runs := &handoffRuns{started: make(chan handoffRun, 16)}
			b, qb := handoffReplica(ns, "b", replicaOptions{releaseOnCancel: true}, runs, &logLines{})
			stopB, doneB := startManager(b, qb)

			By("stopping the leader: it claims x and hands the lease over")
			stopped := time.Now() // b sees the claim first no earlier than this
			Expect(a.cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
			Eventually(a.logged(`"msg"="Handed the lease over"`), 30*time.Second).Should(BeTrue())
			Eventually(b.Elected(), 15*time.Second).Should(BeClosed())
			claim, ok := claimOf(ctx, ns)
			Expect(ok).To(BeTrue())
			Expect(ptr.Deref(claim.Spec.HolderIdentity, "")).To(Equal(holder))
			d := time.Duration(ptr.Deref(claim.Spec.LeaseDurationSeconds, 0)) * time.Second
			Expect(d).To(Equal(4*time.Second), "the claim lasts LeaseDuration + Cleanup (0)")
			Expect(claim.Spec.RenewTime.Time).To(BeTemporally("<", time.Now().Add(-50*time.Minute)),
				"the holder's clock is an hour behind")
			// Longer than a claim duration + MaxClaimRecheck from b's first sight of the claim:
			// only the holder's renewals, as b sees them, keep x from b.
			Consistently(runs.started, d+3*time.Second).ShouldNot(Receive(), "b leaves x alone while its holder lives")

			By("killing the leader mid-work: its claim stays, never renewed nor deleted")
			killed := time.Now()
			a.kill()
			Expect(a.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal()).To(Equal(syscall.SIGKILL))
			Expect(a.logged("Claimed work finished")()).To(BeFalse(), "its work never ended")
			Expect(a.logged("DATA RACE")()).To(BeFalse())
			claim, ok = claimOf(ctx, ns)
			Expect(ok).To(BeTrue())
			Expect(ptr.Deref(claim.Spec.HolderIdentity, "")).To(Equal(holder))

			var run handoffRun
			Eventually(runs.started, 30*time.Second).Should(Receive(&run))
			Expect(run.Object).To(Equal("x"))
			GinkgoWriter.Printf("b ran x %v after the leader's stop began, %v after its SIGKILL\n",
				run.start.Sub(stopped).Round(time.Millisecond), run.start.Sub(killed).Round(time.Millisecond))
			Expect(run.start).To(BeTemporally(">=", killed), "never while the holder lived")
			Expect(run.start.Sub(stopped)).To(BeNumerically(">=", d),
				"one claim duration from b's first sight of the claim, by b's clock, not from the holder's renewTime")

			stopB()
			Eventually(doneB, 30*time.Second).Should(Receive(BeNil()))
			expectNoLeaks(cur)
		})
})
