package shutdowntest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quiesce-dev/quiesce/runnable"
	"github.com/quiesce-dev/quiesce/shutdowntest"
	"github.com/quiesce-dev/quiesce/shutdowntest/internal/logline"
)

// The same operator (testdata/logformats) in each log format the harness reads (each line read
// as that format): the stop's
// timeline, the reconcile SIGTERM cut, the call quiesce abandoned, the reconcile that never
// ended and the manager giving up on it are read alike; in a format it does not read
// (go-logr/funcr), Stop says so and how to switch.
func TestLogFormats(t *testing.T) {
	env, c := environment(t)
	for _, format := range []string{"zap-console", "zap-json", "slog-text", "slog-json", "logrus-text", "logrus-json", "funcr"} {
		t.Run(format, func(t *testing.T) {
			g := NewWithT(t)
			ctx := t.Context()
			op, err := shutdowntest.Start(ctx, shutdowntest.Options{
				Package: "./testdata/logformats", Env: env, Output: t.Output(), LogPrefix: format + " | ",
				Flags: serverFlags, Args: []string{"--log-format=" + format}, StopTimeout: 30 * time.Second,
			})
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(op.Kill)
			ns := "logformat-" + format
			g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
			for _, name := range []string{"cut", "hang"} {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
					Name: name, Namespace: ns, Labels: map[string]string{"logformat": labelValue},
				}}
				g.Expect(c.Create(ctx, cm)).To(Succeed())
				// Deleted at once: the next format's operator watches every namespace.
				t.Cleanup(func() { g.Expect(client.IgnoreNotFound(c.Delete(context.Background(), cm))).To(Succeed()) })
			}
			// Both reconciles work, tracked by quiesce (the operator's line, in any format).
			g.Expect(op.WaitLines(ctx, 2, func(l string) bool {
				return strings.Contains(l, "Working") && strings.Contains(l, ns)
			})).To(Succeed())

			res, err := op.Stop(ctx)
			if format == "funcr" {
				g.Expect(err).To(MatchError(And(
					ContainSubstring("failed to read the operator's log: none of its"),
					ContainSubstring("controller-runtime's zap logger (log/zap), console or JSON, log/slog's text or JSON"),
					ContainSubstring("and logrus' text or JSON formatter through bombsimon/logrusr"),
					ContainSubstring("ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil)))"),
				)))
				g.Expect(res.Timeline).To(BeEmpty())
				g.Expect(res).NotTo(shutdowntest.HaveExitedGracefully()) // exit code 1
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			// Every line the harness read is read as the format the operator wrote.
			read := 0
			for _, l := range res.Lines {
				if e, ok := logline.Parse(l); ok {
					read++
					g.Expect(e.Format).To(Equal(logline.Format(format)), "%q", l)
				}
			}
			g.Expect(read).To(BeNumerically(">=", 10))
			g.Expect(res.ExitCode).To(Equal(1))
			steps := make([]string, 0, len(res.Timeline))
			for _, s := range res.Timeline {
				steps = append(steps, s.Message)
				g.Expect(s.SinceStop).NotTo(BeEmpty())
			}
			// The lines between (reports, cancellations) are quiesce's to change.
			g.Expect(len(steps)).To(BeNumerically(">=", 3), "%v", steps)
			g.Expect(steps[:2]).To(Equal([]string{"Stop began", "Draining executor"}))
			g.Expect(steps[len(steps)-1]).To(Equal(runnable.AbandonedMessage))
			// controller-runtime's reconcileID, a types.UID, as it is: logrusr writes it as JSON.
			uid := HaveField("ReconcileID", MatchRegexp(`^[0-9a-f]{8}-[0-9a-f-]{27}$`))
			g.Expect(res.Cut()).To(ConsistOf(And(HaveField("Controller", "logformat"), HaveField("Namespace", ns),
				HaveField("Name", "cut"), HaveField("Error", ContainSubstring("context canceled")), uid)))
			g.Expect(res).To(shutdowntest.HaveAbandoned("logformat/" + ns + "/hang"))
			g.Expect(res.Unfinished()).To(ConsistOf(And(HaveField("Namespace", ns), HaveField("Name", "hang"), uid)))
			g.Expect(res.GaveUp).To(BeTrue())
		})
	}
}
