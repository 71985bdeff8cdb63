package shutdowntest_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// lockedBuffer is an Output that the test reads while the harness writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A leader and a standby of testdata/secure (its main package given as "."; leader election;
// metrics over HTTPS with authentication, read with a token the harness makes): the leader's
// pending calls as Go values, then its stop and the standby taking over.
func TestLeaderAndStandby(t *testing.T) {
	env, c := environment(t)
	g := NewWithT(t)
	ctx := t.Context()
	var out lockedBuffer
	replica := func(name string) *shutdowntest.Operator {
		op, err := shutdowntest.Start(ctx, shutdowntest.Options{
			Package: ".", Dir: secureOperator, Env: env, StopTimeout: 20 * time.Second,
			MetricsSecure: true, LeaderElection: true, LogPrefix: name + " | ", Output: &out,
		})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(op.Kill)
		return op
	}
	leader := replica("leader")
	g.Expect(leader.WaitLeader(ctx)).To(Succeed())
	standby := replica("standby")

	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "replicas"}})).To(Succeed())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "job-1", Namespace: "replicas", Labels: map[string]string{"secure": labelValue},
	}}
	g.Expect(c.Create(ctx, cm)).To(Succeed())
	t.Cleanup(func() { g.Expect(c.Delete(context.Background(), cm)).To(Succeed()) })

	g.Eventually(leader.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50 * time.Millisecond).
		Should(Equal(2)) // the reconcile and its call
	calls, err := leader.PendingCalls(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(calls).To(ContainElement(And(
		HaveField("Name", "secure/replicas/job-1/work"),
		HaveField("Handler", ContainSubstring("main.go")),
		HaveField("Where", Not(BeEmpty())),
		HaveField("ReconcileID", Not(BeEmpty())),
	)))
	g.Eventually(standby.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).
		Should(Equal(0), "a standby runs no reconcile") // once its metrics server listens

	res, err := leader.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())
	g.Expect(standby.WaitLeader(ctx)).To(Succeed())
	g.Eventually(standby.PendingCount).WithContext(ctx).WithTimeout(time.Minute).WithPolling(50*time.Millisecond).
		Should(Equal(2), "the new leader reconciles the ConfigMap again")
	res, err = standby.Stop(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res).To(shutdowntest.HaveExitedGracefully())

	g.Expect(out.String()).To(And(ContainSubstring("\nleader | "), ContainSubstring("\nstandby | ")))
	g.Expect(res.Lines[0]).NotTo(HavePrefix("standby | "))
}

// Without credentials the secure metrics server refuses the harness: the error says so.
func TestSecureMetricsWithAWrongToken(t *testing.T) {
	env, _ := environment(t)
	g := NewWithT(t)
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: ".", Dir: secureOperator, Env: env, MetricsSecure: true, MetricsToken: "not-a-token",
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(op.Kill)
	g.Eventually(func() error { _, err := op.PendingCalls(t.Context()); return err }).WithTimeout(time.Minute).
		WithPolling(50 * time.Millisecond).Should(MatchError(And(ContainSubstring("https://"), ContainSubstring("status 401"))))
}
