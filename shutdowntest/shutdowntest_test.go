package shutdowntest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quiesce-dev/quiesce/runnable"
	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// One control plane for the package's tests, started by the first test that needs it and
// stopped by TestMain, before the leak check.
var shared struct {
	once sync.Once
	env  *envtest.Environment
	c    client.Client
	err  error
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "failed to stop the control plane:", err)
			code = 1
		}
	}
	if err := shutdowntest.Cleanup(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code == 0 {
		// Ginkgo's interrupt handler (TestGinkgo) waits for a signal for the life of the process.
		ginkgo := goleak.IgnoreTopFunction(
			"github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func2")
		if err := goleak.Find(ginkgo); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// environment returns the package's control plane and a client of it.
func environment(t *testing.T) (*envtest.Environment, client.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a control plane and builds an operator: skipped with -short")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run `make test`, or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	shared.once.Do(func() {
		env := &envtest.Environment{}
		cfg, err := env.Start()
		if err != nil {
			shared.err = fmt.Errorf("failed to start the control plane: %w", err)
			return
		}
		shared.env = env
		shared.c, shared.err = client.New(cfg, client.Options{})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.env, shared.c
}

// Test fixtures shared by the package's tests.
const (
	mastersGroup   = "system:masters"  // envtest users with every right
	secureOperator = "testdata/secure" // an operator with HTTPS metrics and leader election
	labelValue     = "quiesce"         // the fixtures' label value selecting their ConfigMaps
)

// stubborn is the main package of an operator that ignores SIGTERM.
const stubborn = "./testdata/stubborn"

// serverFlags are the flags of a main with a metrics and a probe server and nothing more.
func serverFlags(e shutdowntest.Endpoints) []string {
	return []string{"--metrics-bind-address=" + e.Metrics, "--health-probe-bind-address=" + e.Probe}
}

// demoOptions run examples/demo-operator, which has no --metrics-secure flag: its metrics
// server always serves plain HTTP, and /debug/quiesce on its debug listener.
func demoOptions(env *envtest.Environment, args ...string) shutdowntest.Options {
	return shutdowntest.Options{
		Package: "./examples/demo-operator",
		Dir:     "..",
		Env:     env,
		Flags: func(e shutdowntest.Endpoints) []string {
			return append(serverFlags(e), "--quiesce-debug-address="+e.Debug)
		},
		Args:        args,
		StopTimeout: 30 * time.Second,
	}
}

// testingT is what createConfigMaps needs of a *testing.T or GinkgoT().
type testingT interface {
	Helper()
	Fatal(args ...any)
	Error(args ...any)
	Cleanup(func())
}

// createConfigMaps creates a namespace and in it the ConfigMaps names labelled for the demo
// operator; they are deleted when the test ends, so that no later operator reconciles them.
func createConfigMaps(ctx context.Context, t testingT, c client.Client, ns string, names ...string) {
	t.Helper()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, Labels: map[string]string{"demo": labelValue},
		}}
		if err := c.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := client.IgnoreNotFound(c.Delete(context.Background(), cm)); err != nil {
				t.Error(err)
			}
		})
	}
}

// checkGone fails unless no process has pid any more.
func checkGone(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d: kill(0) = %v, want ESRCH: the operator is still there", pid, err)
	}
}

func TestGracefulStop(t *testing.T) {
	env, c := environment(t)
	ctx := t.Context()
	g := NewWithT(t)
	const grace = 6 * time.Second
	op, err := shutdowntest.Start(ctx, demoOptions(env,
		"--grace-period="+grace.String(), "--cancel-after=4s", "--work=1500ms"))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	createConfigMaps(ctx, t, c, "graceful", "job-1", "job-2", "job-3")
	// Each ConfigMap: its reconcile and its snapshot call.
	g.Eventually(op.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(BeNumerically(">=", 6))

	// Two concurrent Stops send one SIGTERM (a second one would make the operator exit at once).
	again := make(chan *shutdowntest.Result, 1)
	go func() {
		res, _ := op.Stop(ctx)
		again <- res
	}()
	res, err := op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	g.Expect(res.Took).To(BeNumerically("<", grace))
	g.Expect(<-again).To(shutdowntest.HaveExitedGracefully())
	g.Expect(res.Abandoned).To(BeEmpty())
	g.Expect(res).To(shutdowntest.HaveLogged("All calls returned"))
	g.Expect(res).NotTo(shutdowntest.HaveLogged(runnable.AbandonedMessage))
	steps := make([]string, 0, len(res.Timeline))
	for _, s := range res.Timeline {
		steps = append(steps, s.Message)
	}
	g.Expect(steps).To(HaveExactElements(append([]any{"Stop began", "Draining executor"},
		append(slices.Repeat([]any{"Waiting for pending calls"}, max(0, len(steps)-3)), "All calls returned")...)...))
	checkGone(t, op.Pid())
	t.Logf("graceful stop: exit code %d, took %s, %d lines, killed %t",
		res.ExitCode, res.Took.Round(time.Millisecond), len(res.Lines), res.Killed)
}

func TestHangingHandlerIsAbandoned(t *testing.T) {
	env, c := environment(t)
	ctx := t.Context()
	g := NewWithT(t)
	op, err := shutdowntest.Start(ctx, demoOptions(env, "--grace-period=2s", "--cancel-after=1s"))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	createConfigMaps(ctx, t, c, "hanging", "hang-1")
	g.Eventually(op.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(BeNumerically(">=", 2))

	res, err := op.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).NotTo(shutdowntest.HaveExitedGracefully())
	g.Expect(res.ExitCode).To(Equal(1))
	g.Expect(res.Killed).To(BeFalse())
	g.Expect(res).To(shutdowntest.HaveAbandoned("demo/hanging/hang-1/legacy-export"))
	g.Expect(res).To(shutdowntest.HaveAbandoned(HaveSuffix("/legacy-export")))
	g.Expect(res.AbandonedCount).To(Equal(1))
	checkGone(t, op.Pid())
	t.Logf("hanging handler: exit code %d, took %s, %d lines, abandoned %v",
		res.ExitCode, res.Took.Round(time.Millisecond), len(res.Lines), res.Abandoned)
}

func TestBuildFails(t *testing.T) {
	g := NewWithT(t)
	_, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: "./testdata/nobuild",
		Env:     &envtest.Environment{}, // never used: the build fails first
	})
	g.Expect(err).To(MatchError(And(
		ContainSubstring("failed to build ./testdata/nobuild"),
		ContainSubstring(`cannot use "not an int"`), // go build's own output
	)))
}

func TestNeverReady(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	const readyTimeout = 2 * time.Second
	opts := shutdowntest.Options{Package: "./testdata/neverready", Env: env, ReadyTimeout: readyTimeout}
	// Build first: ReadyTimeout counts from the process's start.
	_, err := shutdowntest.Build(t.Context(), opts)
	g.Expect(err).NotTo(HaveOccurred())

	start := time.Now()
	op, err := shutdowntest.Start(t.Context(), opts)
	took := time.Since(start)
	g.Expect(op).To(BeNil())
	g.Expect(err).To(MatchError(And(
		ContainSubstring("did not answer 200 within 2s (last: status 503)"),
		ContainSubstring("waits for a cache that never syncs"), // its log
	)))
	g.Expect(took).To(BeNumerically("<", readyTimeout+5*time.Second))
	m := regexp.MustCompile(`neverready: pid (\d+)`).FindStringSubmatch(err.Error())
	g.Expect(m).To(HaveLen(2))
	pid, _ := strconv.Atoi(m[1])
	checkGone(t, pid)
}

func TestExitsAtStart(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), demoOptions(env, "--no-such-flag"))
	g.Expect(op).To(BeNil())
	g.Expect(err).To(MatchError(And(
		ContainSubstring("exited before it was ready (exit status 2)"),
		ContainSubstring("flag provided but not defined: -no-such-flag"), // its output
	)))
}

func TestStopKillsAnOperatorThatIgnoresSIGTERM(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	const stopTimeout = 500 * time.Millisecond
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: stubborn, Env: env, StopTimeout: stopTimeout,
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	res, err := op.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Killed).To(BeTrue())
	g.Expect(res.ExitCode).To(Equal(-1)) // SIGKILL
	// SIGTERM, StopTimeout, a second SIGTERM, StopTimeout again, SIGKILL.
	g.Expect(res.Took).To(BeNumerically(">=", 2*stopTimeout))
	g.Expect(res.Took).To(BeNumerically("<", 2*stopTimeout+5*time.Second))
	g.Expect(res).To(shutdowntest.HaveLogged("stubborn: pid"))
	g.Expect(res).NotTo(shutdowntest.HaveExitedGracefully())
	checkGone(t, op.Pid())
}

func TestContextEndKillsOperator(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(t.Context())
	op, err := shutdowntest.Start(ctx, demoOptions(env))
	g.Expect(err).NotTo(HaveOccurred())
	cancel()
	// Reaped by the harness: no zombie left either.
	g.Eventually(func() error { return syscall.Kill(op.Pid(), 0) }).WithTimeout(10 * time.Second).
		WithPolling(10 * time.Millisecond).Should(MatchError(syscall.ESRCH))
	op.Kill() // a no-op now: waits for the harness's goroutines
	res, err := op.Stop(t.Context())
	g.Expect(err).To(MatchError(ContainSubstring("it had exited already (signal: killed)")))
	g.Expect(res.ExitCode).To(Equal(-1))
	g.Expect(op.Signal(syscall.SIGTERM)).To(MatchError(ContainSubstring("the operator exited")))
}

func TestWaitLines(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{Package: stubborn, Env: env})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	says := func(s string) func(string) bool { return func(l string) bool { return strings.Contains(l, s) } }

	g.Expect(op.WaitLines(t.Context(), 1, says("ignores SIGTERM"))).To(Succeed())
	// A line that does not come: the context bounds the wait.
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	g.Expect(op.WaitLines(ctx, 2, says("ignores SIGTERM"))).To(And(
		MatchError(context.DeadlineExceeded), MatchError(ContainSubstring("(got 1,"))))
	// The operator exits: the wait ends with its status.
	op.Kill()
	g.Expect(op.WaitLines(t.Context(), 1, says("never logged"))).
		To(MatchError(ContainSubstring("the operator exited (signal: killed) after 0")))
	g.Expect(op.WaitLines(t.Context(), 1, says("ignores SIGTERM"))).To(Succeed())
}
