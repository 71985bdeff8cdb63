package shutdowntest_test

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// What a stop loses: the same three reconciles, SIGTERM while each works, on an operator
// without quiesce (testdata/plain: all three cut, no snapshot written), on it again with
// reconciles that ignore their context (the manager gives up after its graceful shutdown
// timeout: all three unfinished, no snapshot written) and on the demo operator with quiesce
// (none cut, every snapshot written).
func TestWhatWouldAStopLose(t *testing.T) {
	env, c := environment(t)
	ctx := t.Context()
	reconciling := func(l string) bool { return strings.Contains(l, "\tReconciling\t") }
	run := func(ns string, opts shutdowntest.Options) (*shutdowntest.Result, int) {
		g := NewWithT(t)
		opts.Args = append(opts.Args, "--zap-log-level=5")
		opts.Output = t.Output()
		op, err := shutdowntest.Start(ctx, opts)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(op.Kill)
		createConfigMaps(ctx, t, c, ns, "job-1", "job-2", "job-3")
		g.Expect(op.WaitLines(ctx, 3, reconciling)).To(Succeed())
		res, err := op.Stop(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		var cms corev1.ConfigMapList
		g.Expect(c.List(ctx, &cms, client.InNamespace(ns))).To(Succeed())
		written := 0
		for _, cm := range cms.Items {
			if _, ok := cm.Annotations["quiesce.dev/snapshot"]; ok {
				written++
			}
		}
		// Each operator watches every namespace: the next run must not reconcile these.
		g.Expect(c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(ns),
			client.MatchingLabels{"demo": labelValue})).To(Succeed())
		t.Logf("%s: exit code %d after %s, gave up %t, %d of 3 snapshots written",
			ns, res.ExitCode, res.Took.Round(time.Millisecond), res.GaveUp, written)
		for _, r := range res.Cut() {
			t.Logf("%s: cut: %s", ns, r)
		}
		for _, r := range res.Unfinished() {
			t.Logf("%s: unfinished: %s", ns, r)
		}
		return res, written
	}

	plain, written := run("without-quiesce", shutdowntest.Options{Package: "./testdata/plain", Env: env,
		Flags: serverFlags, Args: []string{"--work=5s"}, StopTimeout: 30 * time.Second})
	g := NewWithT(t)
	g.Expect(plain.Cut()).To(HaveLen(3))
	g.Expect(plain.Cut()).To(HaveEach(HaveField("Error", ContainSubstring("context canceled"))))
	g.Expect(plain.GaveUp).To(BeFalse())
	g.Expect(written).To(BeZero())

	// Reconciles that ignore their context outlive the manager's 1s graceful shutdown timeout:
	// it gives up, main exits 1, and the process's exit abandons them mid-work.
	hung, written := run("hung-without-quiesce", shutdowntest.Options{Package: "./testdata/plain", Env: env,
		Flags: serverFlags, StopTimeout: 10 * time.Second,
		Args: []string{"--work=60s", "--ignore-context", "--graceful-shutdown-timeout=1s"}})
	g.Expect(hung.GaveUp).To(BeTrue())
	g.Expect(hung.Killed).To(BeFalse())
	g.Expect(hung.ExitCode).To(Equal(1))
	g.Expect(hung.Cut()).To(BeEmpty())
	g.Expect(hung.Unfinished()).To(ConsistOf(
		HaveField("Name", "job-1"), HaveField("Name", "job-2"), HaveField("Name", "job-3")))
	g.Expect(hung.Unfinished()).To(HaveEach(HaveField("Namespace", "hung-without-quiesce")))
	g.Expect(written).To(BeZero())

	withQuiesce, written := run("with-quiesce", demoOptions(env, "--work=1500ms", "--grace-period=6s", "--cancel-after=4s"))
	g.Expect(withQuiesce.Cut()).To(BeEmpty())
	g.Expect(withQuiesce.Unfinished()).To(BeEmpty())
	g.Expect(written).To(Equal(3))
}
