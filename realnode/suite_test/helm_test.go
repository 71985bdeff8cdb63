//go:build realnode

package realnode_test

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/realnode"
)

// The Helm operator of examples/helm-operator and the work of its chart on the real node: a
// Deployment of readyAfterImage (the chart's value readyImage) Ready after the seconds its
// version names ("2-ready45").
const (
	helmOperatorImage = "localhost/helm-operator:test"
	readyAfterImage   = "localhost/ready-after:test"
	// helmLabel selects the ConfigMaps the operator reconciles (its controller.LabelKey); the
	// release is named after the ConfigMap.
	helmLabel   = "helm-operator.example.com/release"
	helmRelease = "work"
	// otherOperation is Helm's error for a release whose last revision is pending.
	otherOperation = "another operation (install/upgrade/rollback) is in progress"
	// abandonedMessage is quiesce's runnable.AbandonedMessage; gaveUpText controller-runtime's
	// error when its runnables outlive GracefulShutdownTimeout (shutdowntest.GaveUpText).
	abandonedMessage = "Abandoned calls still running after the grace period"
	gaveUpText       = "failed waiting for all runnables to end within grace period"
	// helmRestartWatch is how long the restarted operator (the next pod) is watched.
	helmRestartWatch = 30 * time.Second
)

// helmCase is one cell: the upgrade's pod is Ready U seconds after its start, the atomic
// rollback's (revision 1's) R; the operator runs with quiesce or without, within its budget.
type helmCase struct {
	Name    string // the namespace is "helm-<Name>"
	U, R    int
	Quiesce bool
	// GracePeriod and Cleanup are quiesce's (0: its default, 25 s; no cleanup window);
	// ShutdownTimeout the manager's GracefulShutdownTimeout.
	GracePeriod, Cleanup, ShutdownTimeout time.Duration
	// MarkFailed: the operator's OnAbandon hook marks an abandoned release failed.
	MarkFailed bool
}

func (c helmCase) String() string {
	s := fmt.Sprintf("U %d s, R %d s, %s", c.U, c.R, mode(c.Quiesce))
	if c.GracePeriod > 0 {
		s += fmt.Sprintf(", GracePeriod %v", c.GracePeriod)
	}
	if c.Cleanup > 0 {
		s += fmt.Sprintf(", Cleanup %v", c.Cleanup)
	}
	if c.MarkFailed {
		s += ", OnAbandon marks failed"
	}
	return s
}

// terminationGrace leaves the kubelet's SIGKILL well after the manager's own limit.
func (c helmCase) terminationGrace() time.Duration { return c.ShutdownTimeout + 30*time.Second }

func (c helmCase) args(ns string) []string {
	args := []string{
		"--namespace=" + ns, "--quiesce=" + strconv.FormatBool(c.Quiesce),
		"--graceful-shutdown-timeout=" + c.ShutdownTimeout.String(),
		"--health-probe-bind-address=:8081", "--zap-encoder=json", "--zap-time-encoding=rfc3339nano",
		// Helm's wait polls every 2 s: 500 ms puts the end of the work closer to the pod's Ready.
		"--helm-poll-interval=500ms",
	}
	if c.Quiesce {
		args = append(args, "--quiesce-termination-grace-period="+c.terminationGrace().String())
		if c.GracePeriod > 0 {
			args = append(args, "--quiesce-grace-period="+c.GracePeriod.String())
		}
		if c.Cleanup > 0 {
			args = append(args, "--cleanup="+c.Cleanup.String())
		}
		if c.MarkFailed {
			args = append(args, "--mark-failed-on-abandon")
		}
	}
	return args
}

// helmOutcome is what a stop 3 s into pending-upgrade left and logged.
type helmOutcome struct {
	Case helmCase
	// Installed: the ConfigMap's create to revision 1 deployed (R, the pod's start, Helm's poll).
	Installed time.Duration
	// Upgraded: pending-upgrade seen to the operator's "Upgraded" line (0: it never upgraded);
	// RolledBack: quiesce's cancel to its "All calls returned" line, the rollback done (0: not
	// seen). The work as Helm saw it: U or R, the Recreate of the Deployment's pod, the
	// probe, Helm's poll.
	Upgraded, RolledBack time.Duration
	// State and Revision are the release's last record's once the operator exited.
	State    string
	Revision int
	// OtherOps counts the restarted operator's otherOperation errors in helmRestartWatch;
	// RestartedWorked says it started its controller's workers.
	OtherOps        int
	RestartedWorked bool
	// Took: the pod's delete (the kubelet's SIGTERM) to the operator's last log line.
	Took     time.Duration
	ExitCode int
	// GaveUp: the manager gave up at GracefulShutdownTimeout.
	GaveUp bool
	// Reported: a report of pending calls named the upgrade with its line in release.go.
	Reported bool
	// Cancelled, Abandoned: when quiesce logged "Cancelling calls still running" and its
	// abandoned line (since the delete; 0: never), and the calls it named abandoned.
	Cancelled, AbandonedAt time.Duration
	Abandoned              []string
	// Marked: the OnAbandon hook logged "Marked the release failed".
	Marked bool
}

var _ = Describe("the Helm operator stopped 3 s into pending-upgrade", func() {
	It("should leave the release pending-rollback under plain controller-runtime, and deployed under quiesce where the upgrade or its rollback fits the budget", func(ctx SpecContext) {
		root, err := filepath.Abs("../..")
		Expect(err).NotTo(HaveOccurred())
		By("building the images of examples/helm-operator and of its chart's work")
		Expect(node.Load(ctx,
			realnode.Image{Name: helmOperatorImage, Package: "example.com/helm-operator", Dir: filepath.Join(root, "examples", "helm-operator")},
			realnode.Image{Name: readyAfterImage, Package: "./suite_test/readyafter", Dir: filepath.Join(root, "realnode")},
		)).To(Succeed())

		bindCtx, stopBinding := context.WithCancel(ctx)
		var binder sync.WaitGroup
		binder.Go(func() { bindPods(bindCtx, "helm-") })
		defer func() { stopBinding(); binder.Wait() }()

		plain, defaults := 30*time.Second, 30*time.Second
		cases := []helmCase{
			// First: its bound is the tightest (the upgrade, U and the pod's Recreate, must end
			// within the 20 s before the cancel).
			{Name: "quiesce-u10", U: 10, R: 45, Quiesce: true, ShutdownTimeout: defaults},
			{Name: "plain-u10", U: 10, R: 45, ShutdownTimeout: plain},
			{Name: "plain-u45", U: 45, R: 45, ShutdownTimeout: plain},
			{Name: "quiesce-u45", U: 45, R: 45, Quiesce: true, ShutdownTimeout: defaults},
			// The cleanup window: cancel at 100 − 70 = 30 s, the 45 s rollback ends within 100 s.
			{Name: "cleanup-u45", U: 45, R: 45, Quiesce: true, GracePeriod: 100 * time.Second, Cleanup: 70 * time.Second,
				ShutdownTimeout: 105 * time.Second},
			// The defaults with the abandon hook: the release marked failed, upgraded after the restart.
			{Name: "marked-u45", U: 45, R: 45, Quiesce: true, ShutdownTimeout: defaults, MarkFailed: true},
		}
		res := make([]*helmOutcome, len(cases))
		var wg sync.WaitGroup
		for i, c := range cases {
			wg.Go(func() {
				defer GinkgoRecover()
				// Staggered: six Recreate rollouts and six stops at once would load the node's
				// two cores enough to stretch the work by seconds.
				select {
				case <-time.After(time.Duration(i) * 5 * time.Second):
				case <-ctx.Done():
				}
				res[i] = helmStop(ctx, c)
			})
		}
		wg.Wait()
		Expect(res).NotTo(ContainElement(BeNil()))
		AddReportEntry("the Helm operator on a real node", helmTable(res))
		GinkgoWriter.Println(helmTable(res))

		for _, o := range res {
			c := o.Case
			Expect(o.RestartedWorked).To(BeTrue(), "%s: the restarted operator never started its workers", c)
			if !c.Quiesce {
				// controller-runtime cancels the upgrade at SIGTERM; the 45 s rollback outlives
				// its 30 s: the manager gives up, the process exits, the release stays pending.
				Expect(o.State).To(Equal("pending-rollback"), "%s: the release's state", c)
				Expect(o.OtherOps).To(BeNumerically(">", 0), "%s: the restarted operator's %q errors", c, otherOperation)
				Expect(o.GaveUp).To(BeTrue(), "%s: the manager gave up at its GracefulShutdownTimeout", c)
				Expect(o.ExitCode).To(Equal(1), "%s: exit code", c)
				Expect(o.Took).To(BeNumerically("~", c.ShutdownTimeout, 10*time.Second), "%s: the stop", c)
				Expect(o.Reported || o.Cancelled > 0 || o.AbandonedAt > 0).To(BeFalse(), "%s: quiesce logged", c)
				continue
			}
			Expect(o.GaveUp).To(BeFalse(), "%s: the manager gave up", c)
			Expect(o.Reported).To(BeTrue(), "%s: a report named the upgrade with its line in release.go", c)
			switch c.Name {
			case "quiesce-u10":
				// The upgrade ends 7 s after the stop (and a pod's start), before the cancel at 20 s.
				Expect(o.State).To(Equal("deployed"), "%s: the release's state", c)
				Expect(o.Revision).To(Equal(2), "%s: the upgrade's revision", c)
				Expect(o.Upgraded).To(BeNumerically(">=", time.Duration(c.U)*time.Second), "%s: the upgrade waited for its pod", c)
				Expect(o.OtherOps).To(BeZero(), "%s: the restarted operator's %q errors", c, otherOperation)
				Expect(o.Cancelled).To(BeZero(), "%s: cancelled", c)
				Expect(o.Abandoned).To(BeEmpty(), "%s: abandoned", c)
				Expect(o.ExitCode).To(Equal(0), "%s: exit code", c)
				Expect(o.Took).To(BeNumerically("<", 20*time.Second), "%s: the stop", c)
			case "quiesce-u45", "marked-u45":
				// Cancelled at 20 s; the rollback has 5 s of its 45 when quiesce abandons it at 25 s.
				Expect(o.Cancelled).To(BeNumerically("~", 20*time.Second, 5*time.Second), "%s: cancelled", c)
				Expect(o.Abandoned).To(ContainElement(HaveSuffix("/upgrade")), "%s: abandoned", c)
				Expect(o.AbandonedAt).To(BeNumerically("~", 25*time.Second, 5*time.Second), "%s: abandoned", c)
				Expect(o.ExitCode).To(Equal(1), "%s: exit code", c)
				Expect(o.Took).To(BeNumerically("~", 25*time.Second, 10*time.Second), "%s: the stop", c)
				if c.MarkFailed {
					// Helm upgrades a failed release: the next pod is not stuck.
					Expect(o.Marked).To(BeTrue(), "%s: the hook marked the release failed", c)
					Expect(o.State).To(Equal("failed"), "%s: the release's state", c)
					Expect(o.OtherOps).To(BeZero(), "%s: the restarted operator's %q errors", c, otherOperation)
				} else {
					Expect(o.State).To(Equal("pending-rollback"), "%s: the release's state", c)
					Expect(o.OtherOps).To(BeNumerically(">", 0), "%s: the restarted operator's %q errors", c, otherOperation)
				}
			case "cleanup-u45":
				// Cancelled at 30 s; the 45 s rollback ends within the window: rolled back.
				Expect(o.State).To(Equal("deployed"), "%s: the release's state", c)
				Expect(o.Revision).To(Equal(3), "%s: the rollback's revision", c)
				Expect(o.RolledBack).To(BeNumerically(">=", time.Duration(c.R)*time.Second), "%s: the rollback waited for its pod", c)
				Expect(o.OtherOps).To(BeZero(), "%s: the restarted operator's %q errors", c, otherOperation)
				Expect(o.Cancelled).To(BeNumerically("~", 30*time.Second, 5*time.Second), "%s: cancelled", c)
				Expect(o.Abandoned).To(BeEmpty(), "%s: abandoned", c)
				Expect(o.ExitCode).To(Equal(0), "%s: exit code", c)
				Expect(o.Took).To(And(BeNumerically(">", 30*time.Second+time.Duration(c.R)*time.Second), BeNumerically("<", c.GracePeriod)),
					"%s: the stop", c)
			}
		}
	}, SpecTimeout(12*time.Minute))
})

// helmStop runs one case in a namespace of its own: the operator installs the release at
// version "1-ready<R>", is asked for "2-ready<U>", is deleted (the kubelet's SIGTERM) 3 s into
// pending-upgrade; then the next pod runs for helmRestartWatch.
func helmStop(ctx context.Context, c helmCase) *helmOutcome {
	GinkgoHelper()
	ns := "helm-" + c.Name
	obs := observe(ns)
	defer obs.stop()
	helmInstall(ctx, ns)
	o := &helmOutcome{Case: c}

	helmOperatorPod(ctx, ns, "stopped", c)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: helmRelease, Labels: map[string]string{helmLabel: "true"}},
		Data:       map[string]string{"version": fmt.Sprintf("1-ready%d", c.R)},
	}
	start := time.Now()
	_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	Eventually(helmLast).WithContext(ctx).WithArguments(ns).WithTimeout(time.Duration(c.R)*time.Second+2*time.Minute).
		Should(Equal(helmRecord{Revision: 1, State: "deployed"}), "%s: the install", c)
	o.Installed = time.Since(start)

	By(fmt.Sprintf("%s: upgrading, then deleting the operator's pod 3 s into pending-upgrade", c))
	patch := fmt.Sprintf(`{"data":{"version":"2-ready%d"}}`, c.U)
	_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, helmRelease, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred())
	Eventually(helmLast).WithContext(ctx).WithArguments(ns).WithPolling(50*time.Millisecond).
		Should(Equal(helmRecord{Revision: 2, State: "pending-upgrade"}), "%s: the upgrade", c)
	pending := time.Now()
	// The case's chosen moment, not a wait for a state.
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
	}
	deleted := time.Now()
	Expect(cs.CoreV1().Pods(ns).Delete(ctx, "stopped", metav1.DeleteOptions{})).To(Succeed())
	Expect(obs.waitLogs(ctx, "stopped")).To(Succeed())
	Eventually(func() *corev1.ContainerStateTerminated { return obs.snapshot()["stopped"].Terminated }).
		WithContext(ctx).ShouldNot(BeNil(), "%s: the kubelet never reported the operator's end", c)
	last, err := helmLast(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	o.State, o.Revision = last.State, last.Revision
	o.read(obs.snapshot()["stopped"], ns, pending, deleted)

	By(fmt.Sprintf("%s: the next pod", c))
	helmOperatorPod(ctx, ns, "restarted", c)
	Eventually(func() bool { return obs.snapshot()["restarted"].following }).WithContext(ctx).
		Should(BeTrue(), "%s: the restarted operator never ran", c)
	select {
	case <-time.After(helmRestartWatch):
	case <-ctx.Done():
	}
	for _, e := range obs.snapshot()["restarted"].lines {
		msg, _ := e["msg"].(string)
		errText, _ := e["error"].(string)
		o.OtherOps += boolInt(msg == "Reconciler error" && strings.Contains(errText, otherOperation))
		o.RestartedWorked = o.RestartedWorked || msg == "Starting workers"
	}
	// Measured: it need not stop well.
	Expect(cs.CoreV1().Pods(ns).Delete(ctx, "restarted", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})).To(Succeed())
	return o
}

// read reads the stopped operator's log: the upgrade's end, its stop's duration and what
// quiesce said.
func (o *helmOutcome) read(r podRecord, ns string, pending, deleted time.Time) {
	upgrade := "release/" + ns + "/" + helmRelease + "/upgrade"
	handler := regexp.MustCompile(`release\.go:\d+`)
	for _, e := range r.lines {
		ts, _ := e["ts"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		msg, _ := e["msg"].(string)
		errText, _ := e["error"].(string)
		if msg == "Upgraded" {
			o.Upgraded = at.Sub(pending)
		}
		if at.Before(deleted) {
			continue
		}
		o.Took = at.Sub(deleted)
		switch {
		case msg == "Waiting for pending calls":
			for _, c := range calls(e) {
				o.Reported = o.Reported || c["name"] == upgrade && handler.MatchString(fmt.Sprint(c["handler"]))
			}
		case msg == "Cancelling calls still running" && o.Cancelled == 0:
			o.Cancelled = o.Took
		case strings.HasPrefix(msg, "All calls returned") && o.Cancelled > 0:
			// The reconcile returned at the cancel (reconcilers.Call does); Helm's rollback
			// ran on, tracked, until this line.
			o.RolledBack = o.Took - o.Cancelled
		case msg == abandonedMessage:
			o.AbandonedAt = o.Took
			for _, c := range calls(e) {
				o.Abandoned = append(o.Abandoned, fmt.Sprint(c["name"]))
			}
		case msg == "Marked the release failed":
			o.Marked = true
		}
		o.GaveUp = o.GaveUp || strings.Contains(errText, gaveUpText)
	}
	o.ExitCode = r.exitCode()
}

// calls are the entries of a quiesce line's "calls" value.
func calls(e map[string]any) []map[string]any {
	l, _ := e["calls"].([]any)
	out := make([]map[string]any, 0, len(l))
	for _, c := range l {
		if m, ok := c.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// helmInstall creates the namespace and the operator's ServiceAccount, with a Role for what
// Helm does in it (its Secrets, the chart's Deployment) and the ConfigMaps it watches.
func helmInstall(ctx context.Context, ns string) {
	GinkgoHelper()
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		return err
	})
	DeferCleanup(func(ctx context.Context) error { return helmUninstall(ctx, ns) })
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: appName}}, metav1.CreateOptions{})
		return err
	})
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: appName},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{"", "apps", "batch", "events.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"*"}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: appName},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: appName, Namespace: ns}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: appName},
		}, metav1.CreateOptions{})
		return err
	})
}

// helmOperatorPod runs the operator as a bare Pod named name, as the harness runs the other
// operator: the node's own image, its ServiceAccount, the kubelet's SIGTERM at its delete.
func helmOperatorPod(ctx context.Context, ns, name string, c helmCase) {
	GinkgoHelper()
	mustCreate(ctx, func(ctx context.Context) error {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{appLabel: appName}},
			Spec: corev1.PodSpec{
				NodeName:                      realnode.NodeName,
				ServiceAccountName:            appName,
				TerminationGracePeriodSeconds: ptr.To(int64(c.terminationGrace() / time.Second)),
				Containers: []corev1.Container{{
					Name: appName, Image: helmOperatorImage, ImagePullPolicy: corev1.PullNever, Args: c.args(ns),
				}},
			},
		}, metav1.CreateOptions{})
		return err
	})
}

// helmUninstall deletes the namespace and waits until it is gone.
func helmUninstall(ctx context.Context, ns string) error {
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		return err
	}
	Eventually(func(ctx context.Context) bool {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return err != nil
	}).WithContext(ctx).WithTimeout(3*time.Minute).Should(BeTrue(), "namespace %s was not deleted", ns)
	return nil
}

// helmRecord is a release's revision and state, as Helm's Secret driver labels its record.
type helmRecord struct {
	Revision int
	State    string
}

// helmLast is the release's last record in ns.
func helmLast(ctx context.Context, ns string) (helmRecord, error) {
	l, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + helmRelease})
	if err != nil {
		return helmRecord{}, err
	}
	var last helmRecord
	for _, s := range l.Items {
		rev, err := strconv.Atoi(s.Labels["version"])
		if err != nil {
			return helmRecord{}, fmt.Errorf("failed to read the revision of %s: %w", s.Name, err)
		}
		if rev > last.Revision {
			last = helmRecord{Revision: rev, State: s.Labels["status"]}
		}
	}
	return last, nil
}

// bindPods stands for the scheduler the node does not run: it binds to the node each pod
// without one in the namespaces named with prefix (the chart's Deployment's), until ctx ends.
func bindPods(ctx context.Context, prefix string) {
	_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
		if err != nil {
			return false, nil // the next poll tries again
		}
		for _, p := range pods.Items {
			if !strings.HasPrefix(p.Namespace, prefix) || p.DeletionTimestamp != nil {
				continue
			}
			_ = cs.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.UID},
				Target:     corev1.ObjectReference{Kind: "Node", Name: realnode.NodeName},
			}, metav1.CreateOptions{})
		}
		return false, nil
	})
}

func helmTable(res []*helmOutcome) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	s := func(d time.Duration) string {
		if d == 0 {
			return "–"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	_, _ = fmt.Fprintln(w, "case\tinstall\tupgrade\trollback after cancel\trelease after the stop\tstop (delete → last line)\texit\tgave up\treported\tcancelled at\tabandoned at\tmarked failed\t\"another operation\" errors in 30 s after restart")
	for _, o := range res {
		_, _ = fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s (revision %d)\t%s\t%d\t%t\t%t\t%s\t%s %v\t%t\t%d\n", o.Case, s(o.Installed), s(o.Upgraded),
			s(o.RolledBack), o.State, o.Revision, s(o.Took), o.ExitCode, o.GaveUp, o.Reported, s(o.Cancelled), s(o.AbandonedAt), o.Abandoned,
			o.Marked, o.OtherOps)
	}
	_ = w.Flush()
	return b.String()
}
