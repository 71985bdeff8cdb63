package shutdowntest_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// forkerOptions run testdata/forker, whose main package is given as "." (built into a file
// named after its directory).
func forkerOptions(env *envtest.Environment, args ...string) shutdowntest.Options {
	return shutdowntest.Options{Package: ".", Dir: "testdata/forker", Env: env, Args: args, StopTimeout: 10 * time.Second}
}

// childOf waits until forker logged its child's pid, and returns it.
func childOf(t *testing.T, op *shutdowntest.Operator) int {
	t.Helper()
	re := regexp.MustCompile(`forker: pid \d+ child (\d+)`)
	if err := op.WaitLines(t.Context(), 1, re.MatchString); err != nil {
		t.Fatal(err)
	}
	for _, l := range op.Lines() {
		if m := re.FindStringSubmatch(l); m != nil {
			pid, _ := strconv.Atoi(m[1])
			return pid
		}
	}
	t.Fatal("no child pid in the log")
	return 0
}

// alive reports whether process pid runs: it exists and is no zombie (a killed child of an
// exited operator waits, a zombie, for whichever process adopted it to reap it). A process
// sent SIGKILL may still run for a moment after kill(2) returned, until the kernel schedules
// it to die: the tests poll, bounded, until it is gone.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// "pid (comm) S ...": the state follows the last ')'.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

func TestKillEndsWhatTheOperatorStarted(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), forkerOptions(env))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	child := childOf(t, op)
	g.Expect(alive(child)).To(BeTrue(), "the operator's child runs")

	op.Kill()
	g.Eventually(func() bool { return alive(child) }).WithTimeout(10*time.Second).Should(BeFalse(),
		"the operator's child %d outlived Kill", child)
	g.Expect(alive(op.Pid())).To(BeFalse())
}

func TestStopEndsWhatTheOperatorLeft(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), forkerOptions(env))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	child := childOf(t, op)

	res, err := op.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	g.Expect(res).To(shutdowntest.HaveLogged("forker: exits, its child still running"))
	g.Eventually(func() bool { return alive(child) }).WithTimeout(10*time.Second).Should(BeFalse(),
		"the operator's child %d outlived the operator", child)
}

func TestLineOfAnyLength(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	const long = 5 << 20
	op, err := shutdowntest.Start(t.Context(), forkerOptions(env, "--long-line="+strconv.Itoa(long)))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	g.Expect(op.WaitLines(t.Context(), 1, func(l string) bool { return strings.Contains(l, `msg="forker: ready"`) })).
		To(Succeed())

	res, err := op.Stop(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Lines).To(HaveLen(4)) // the pids, the long line, ready, exits
	g.Expect(res.Lines[1]).To(And(HavePrefix("xxxx"), HaveSuffix(" [... 4194304 bytes cut]")))
	g.Expect(res.Lines[1]).To(HaveLen(1<<20 + len(" [... 4194304 bytes cut]")))
	g.Expect(res.Lines[2:]).To(HaveExactElements(ContainSubstring(`msg="forker: ready"`),
		ContainSubstring(`msg="forker: exits, its child still running"`)))
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
}

func TestConcurrentStarts(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	_, err := shutdowntest.Build(t.Context(), forkerOptions(env))
	g.Expect(err).NotTo(HaveOccurred())

	const n = 4
	ops := make([]*shutdowntest.Operator, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ops[i], errs[i] = shutdowntest.Start(t.Context(), forkerOptions(env)) })
	}
	wg.Wait()
	for i := range n {
		g.Expect(errs[i]).NotTo(HaveOccurred())
		t.Cleanup(ops[i].Kill)
	}
	for _, op := range ops {
		res, err := op.Stop(t.Context())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	}
}

func TestSecondStopKillsWhenItsContextEnds(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: stubborn, Env: env, StopTimeout: time.Hour,
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	first := make(chan *shutdowntest.Result, 1)
	go func() {
		res, _ := op.Stop(t.Context()) // waits StopTimeout: an hour
		first <- res
	}()
	g.Expect(op.WaitLines(t.Context(), 1, func(l string) bool { return strings.Contains(l, "ignored terminated") })).
		To(Succeed())

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	res, err := op.Stop(ctx)
	g.Expect(err).To(And(MatchError(context.DeadlineExceeded), MatchError(ContainSubstring("killed it"))))
	g.Expect(res.Killed).To(BeTrue())
	g.Expect(res.ExitCode).To(Equal(-1))
	g.Expect(<-first).To(HaveField("Killed", true))
	g.Expect(alive(op.Pid())).To(BeFalse())
}

func TestWaitLinesIsBounded(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	opts := forkerOptions(env)
	opts.WaitTimeout = 100 * time.Millisecond
	op, err := shutdowntest.Start(t.Context(), opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)

	err = op.WaitLines(t.Context(), 1, func(l string) bool { return l == "never logged" })
	g.Expect(err).To(And(MatchError(context.DeadlineExceeded), MatchError(ContainSubstring(
		"failed to wait for 1 matching log lines until")), MatchError(ContainSubstring("Options.WaitTimeout 100ms"))))
}

func TestStartFailsOnADirectory(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	_, err := shutdowntest.Start(t.Context(), shutdowntest.Options{Binary: t.TempDir(), Env: env})
	g.Expect(err).To(MatchError(ContainSubstring("it is a directory, not the operator's binary: set Options.Binary")))

	notExec := t.TempDir() + "/operator"
	g.Expect(os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o600)).To(Succeed())
	_, err = shutdowntest.Start(t.Context(), shutdowntest.Options{Binary: notExec, Env: env})
	g.Expect(err).To(MatchError(ContainSubstring("it is not executable")))
}

// writeFile writes a private file.
func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o600) }
