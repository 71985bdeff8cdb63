//go:build realnode

package realnode_test

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
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
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/realnode"
)

// Issue 51's Helm evidence: examples/helm-operator with leader election, two replicas, its
// leader's pod deleted 3 s into pending-upgrade of a release whose upgrade waits
// helmLeadU seconds for its pod (the rollback to revision 1, helmLeadR), in three modes at
// once: plain controller-runtime, quiesce's FinishAtStop and HandOffAtStop (ShutdownDelay 0).
const (
	// helmLeaseID is examples/helm-operator's LeaderElectionID.
	helmLeaseID = "helm-operator.example.com"
	// U: well above a pod's start on this node (2–8 s), well below the grace period. R: as
	// short as a rollback gets, so that plain controller-runtime's stop, which waits for
	// Helm's rollback, is as short as it gets.
	helmLeadU, helmLeadR = 20, 1
	// The budget: the upgrade's remainder (about U) fits GracePeriod (cancel at 4/5: 48 s).
	helmLeadGrace           = 60 * time.Second
	helmLeadShutdownTimeout = 70 * time.Second
	helmLeadTermination     = 100 * time.Second
	// finishPolicy is --stop-policy's value for reconcilers.FinishAtStop; helmDeployed Helm's
	// state of a release whose work is done.
	finishPolicy = "finish"
	helmDeployed = "deployed"
)

// helmLeadMode is one operator of the spec; Policy is --stop-policy (empty: plain).
type helmLeadMode struct{ Name, Policy string }

var helmLeadModes = []helmLeadMode{{Name: mode(false)}, {Name: finishPolicy, Policy: finishPolicy}, {Name: handoff, Policy: handoff}}

func (m helmLeadMode) label() string {
	switch m.Policy {
	case "":
		return "plain controller-runtime"
	case handoff:
		return "HandOffAtStop"
	default:
		return "FinishAtStop"
	}
}

func (m helmLeadMode) args(ns string) []string {
	args := []string{
		"--namespace=" + ns, "--quiesce=" + strconv.FormatBool(m.Policy != ""),
		"--leader-elect", "--leader-election-retry-period=1s",
		"--graceful-shutdown-timeout=" + helmLeadShutdownTimeout.String(),
		"--helm-poll-interval=500ms",
		// V(5): controller-runtime's "Reconcile successful" and quiesce's V(1) "Object claimed
		// by another replica" show what the successor did with the release.
		"--zap-encoder=json", "--zap-time-encoding=rfc3339nano", "--zap-log-level=5",
	}
	if m.Policy != "" {
		args = append(args, "--stop-policy="+m.Policy, "--quiesce-grace-period="+helmLeadGrace.String(),
			"--quiesce-termination-grace-period="+helmLeadTermination.String())
	}
	return args
}

// helmLeadResult is what one mode showed; durations count from the old leader's SIGTERM, by
// its own log (its first stop line).
type helmLeadResult struct {
	Mode              helmLeadMode
	Leader, Successor string
	// The old leader: its upgrade returned ("Upgraded", or "Reconciler error": plain's rollback
	// done), its last line, its exit code, HandOffAtStop's lines.
	Upgraded, Returned, Stop time.Duration
	// Deployed: the first "Upgraded" of either pod (plain: the successor's, the work redone).
	Deployed            time.Duration
	ExitCode            int
	HandedOver          bool
	Claims              int
	ClaimedWorkFinished bool
	// The successor: "Successfully acquired lease" (its log), the lease's new holder (the
	// test's informer), its first "Reconcile successful", its waits on the claim, its
	// "another operation" errors, and whether it upgraded (redid the work).
	Acquired, HolderSeen, FirstDone time.Duration
	ClaimWaits, OtherOps            int
	SuccessorUpgraded               bool
	Holders                         []string
	// The release: revision 2's (the upgrade's) and 3's (plain: the rollback's) states and the
	// last record when the old leader exited, and the last record once the successor
	// reconciled the upgraded release.
	Revision2, Revision3 string
	AtExit, AtTheEnd     helmRecord
}

var _ = Describe("the Helm operator with leader election, its leader stopped mid-upgrade", func() {
	It("should leave the release deployed at the upgraded version under FinishAtStop and HandOffAtStop, HandOffAtStop handing over about as fast as plain controller-runtime, which cuts the upgrade", func(ctx SpecContext) {
		root, err := filepath.Abs("../..")
		Expect(err).NotTo(HaveOccurred())
		By("building the images of examples/helm-operator and of its chart's work")
		Expect(node.Load(ctx,
			realnode.Image{Name: helmOperatorImage, Package: "example.com/helm-operator", Dir: filepath.Join(root, "examples", "helm-operator")},
			realnode.Image{Name: readyAfterImage, Package: "./suite_test/readyafter", Dir: filepath.Join(root, "realnode")},
		)).To(Succeed())
		bindCtx, stopBinding := context.WithCancel(ctx)
		var binder sync.WaitGroup
		binder.Go(func() { bindPods(bindCtx, "helm-lead-") })
		defer func() { stopBinding(); binder.Wait() }()

		res := make([]*helmLeadResult, len(helmLeadModes))
		var wg sync.WaitGroup
		for i, m := range helmLeadModes {
			wg.Go(func() {
				defer GinkgoRecover()
				// 4 s apart: three Recreate rollouts and stops at once would stretch each other.
				select {
				case <-time.After(time.Duration(i) * 4 * time.Second):
				case <-ctx.Done():
				}
				res[i] = helmLead(ctx, m)
			})
		}
		wg.Wait()
		Expect(res).NotTo(ContainElement(BeNil()))
		AddReportEntry("the Helm operator's leader stopped mid-upgrade", helmLeadTable(res))
		GinkgoWriter.Println(helmLeadTable(res))

		for _, r := range res {
			l := r.Mode.label()
			Expect(r.Acquired).To(BeNumerically(">", 0), "%s: the successor never logged \"Successfully acquired lease\"", l)
			Expect(r.Holders).To(Equal([]string{r.Leader, r.Successor}), "%s: the lease's holders", l)
		}
		p, f, h := res[0], res[1], res[2]
		upgraded := helmRecord{Revision: 2, State: helmDeployed}
		// Plain controller-runtime cancels the upgrade at SIGTERM: Helm marks revision 2
		// failed and rolls back; the successor upgrades again.
		Expect(p.Upgraded).To(BeZero(), "plain: the old leader's upgrade ended")
		Expect(p.Revision2).To(Equal("failed"), "plain: the upgrade's revision once the old leader exited")
		Expect(p.AtExit.Revision).To(BeNumerically(">=", 3), "plain: the rollback's revision")
		Expect(p.SuccessorUpgraded).To(BeTrue(), "plain: the successor redid the upgrade")
		for _, q := range []*helmLeadResult{f, h} {
			l := q.Mode.label()
			Expect(q.Upgraded).To(BeNumerically(">", 0), "%s: the old leader's upgrade never ended", l)
			Expect(q.AtExit).To(Equal(upgraded), "%s: the release once the old leader exited", l)
			Expect(q.AtTheEnd).To(Equal(upgraded), "%s: the release once the successor reconciled it", l)
			Expect(q.SuccessorUpgraded).To(BeFalse(), "%s: the successor upgraded again", l)
			Expect(q.OtherOps).To(BeZero(), "%s: the successor's %q errors", l, otherOperation)
			Expect(q.ExitCode).To(Equal(0), "%s: the old leader's exit code", l)
		}
		// FinishAtStop holds the lease until the upgrade is over.
		Expect(f.Acquired).To(BeNumerically(">", f.Upgraded), "FinishAtStop: the successor led before the upgrade ended")
		// HandOffAtStop hands it over at once; the successor waits on the claim of the
		// release's ConfigMap, then finds the release deployed.
		Expect(h.HandedOver).To(BeTrue(), "HandOffAtStop: the old leader never logged \"Handed the lease over\"")
		Expect(h.Claims).To(Equal(1), "HandOffAtStop: claims handed over")
		Expect(h.ClaimedWorkFinished).To(BeTrue(), "HandOffAtStop: the old leader never logged \"Claimed work finished\"")
		Expect(h.Acquired).To(BeNumerically("<", h.Upgraded), "HandOffAtStop: the successor led only after the upgrade ended")
		Expect(h.ClaimWaits).To(BeNumerically(">=", 1), "HandOffAtStop: the successor never waited on the claim")
		Expect(h.FirstDone).To(BeNumerically(">", h.Upgraded), "HandOffAtStop: the successor reconciled the release before the upgrade ended")
		// The rolling update's margin: within 1 s of plain controller-runtime's.
		Expect(h.Acquired).To(BeNumerically("<=", p.Acquired+time.Second), "HandOffAtStop: the handover, against plain's")
	}, SpecTimeout(6*time.Minute))
})

// helmLead runs one mode in a namespace of its own: two replicas, the release installed at
// "1-ready<R>", upgraded to "2-ready<U>", the leader's pod deleted 3 s into pending-upgrade;
// it returns once the successor reconciled the release at the upgraded version.
func helmLead(ctx context.Context, m helmLeadMode) *helmLeadResult {
	GinkgoHelper()
	ns := "helm-lead-" + m.Name
	obs := observeLease(ns, helmLeaseID)
	defer obs.stop()
	helmInstall(ctx, ns)
	// The lease and HandOffAtStop's claims: Leases in the operator's namespace (list: the
	// successor lists the claims; delete: they end).
	role, err := cs.RbacV1().Roles(ns).Get(ctx, appName, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"},
		Resources: []string{"leases"}, Verbs: strings.Fields("get list create update delete")})
	_, err = cs.RbacV1().Roles(ns).Update(ctx, role, metav1.UpdateOptions{})
	Expect(err).NotTo(HaveOccurred())
	for _, name := range []string{"a", "b"} {
		mustCreate(ctx, func(ctx context.Context) error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{appLabel: appName}},
				Spec: corev1.PodSpec{
					NodeName:                      realnode.NodeName,
					ServiceAccountName:            appName,
					TerminationGracePeriodSeconds: ptr.To(int64(helmLeadTermination / time.Second)),
					Containers: []corev1.Container{{
						Name: appName, Image: helmOperatorImage, ImagePullPolicy: corev1.PullNever, Args: m.args(ns),
					}},
				},
			}, metav1.CreateOptions{})
			return err
		})
	}
	res := &helmLeadResult{Mode: m}
	Eventually(obs.leaseHolders).WithContext(ctx).ShouldNot(BeEmpty(), "%s: no replica led", m.label())
	res.Leader = obs.leaseHolders()[0]
	res.Successor = map[string]string{"a": "b", "b": "a"}[res.Leader]
	Expect(res.Successor).NotTo(BeEmpty(), "%s: the lease's holder %q is no replica", m.label(), res.Leader)
	// The standby's elector runs: the handover measures the stop, not the standby's start.
	Eventually(func() bool { return obs.snapshot()[res.Successor].has("attempting to acquire leader lease") }).
		WithContext(ctx).Should(BeTrue(), "%s: the standby never tried to acquire the lease", m.label())

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: helmRelease, Labels: map[string]string{helmLabel: "true"}},
		Data:       map[string]string{"version": fmt.Sprintf("1-ready%d", helmLeadR)},
	}
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	Eventually(helmLast).WithContext(ctx).WithArguments(ns).WithTimeout(2*time.Minute).
		Should(Equal(helmRecord{Revision: 1, State: helmDeployed}), "%s: the install", m.label())

	By(fmt.Sprintf("%s: upgrading, then deleting the leader's pod 3 s into pending-upgrade", m.label()))
	patch := fmt.Sprintf(`{"data":{"version":"2-ready%d"}}`, helmLeadU)
	_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, helmRelease, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	Expect(err).NotTo(HaveOccurred())
	Eventually(helmLast).WithContext(ctx).WithArguments(ns).WithPolling(50*time.Millisecond).
		Should(Equal(helmRecord{Revision: 2, State: "pending-upgrade"}), "%s: the upgrade", m.label())
	// The chosen moment, not a wait for a state.
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
	}
	Expect(cs.CoreV1().Pods(ns).Delete(ctx, res.Leader, metav1.DeleteOptions{})).To(Succeed())
	Expect(obs.waitLogs(ctx, res.Leader)).To(Succeed())
	Eventually(func() *corev1.ContainerStateTerminated { return obs.snapshot()[res.Leader].Terminated }).
		WithContext(ctx).ShouldNot(BeNil(), "%s: the kubelet never reported the old leader's end", m.label())
	res.AtExit, err = helmLast(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	res.Revision2, err = helmState(ctx, ns, 2)
	Expect(err).NotTo(HaveOccurred())
	res.Revision3, err = helmState(ctx, ns, 3)
	Expect(err).NotTo(HaveOccurred())

	// The successor reconciles the release at the upgraded version: it finds it deployed
	// (quiesce), or upgrades it again (plain).
	old := obs.snapshot()[res.Leader]
	sigterm := old.stopAt()
	Expect(sigterm).NotTo(BeZero(), "%s: the old leader logged no stop", m.label())
	Eventually(func() time.Time {
		s := obs.snapshot()
		upgraded := s[res.Leader].firstAt("Upgraded", sigterm)
		if upgraded.IsZero() {
			upgraded = s[res.Successor].firstAt("Upgraded", sigterm)
		}
		if upgraded.IsZero() {
			return time.Time{}
		}
		return s[res.Successor].firstAt("Reconcile successful", upgraded)
	}).WithContext(ctx).WithTimeout(2*time.Minute).ShouldNot(BeZero(), "%s: the successor never reconciled the upgraded release", m.label())
	res.AtTheEnd, err = helmLast(ctx, ns)
	Expect(err).NotTo(HaveOccurred())
	// Measured: it need not stop well.
	Expect(cs.CoreV1().Pods(ns).Delete(ctx, res.Successor, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})).To(Succeed())
	Expect(obs.waitLogs(ctx, res.Successor)).To(Succeed())
	res.Holders = obs.leaseHolders()
	res.read(old, obs.snapshot()[res.Successor], sigterm, obs.heldSince(res.Successor))
	return res
}

// read reads the old leader's and the successor's logs.
func (res *helmLeadResult) read(old, next podRecord, sigterm, heldSince time.Time) {
	since := func(t time.Time) time.Duration {
		if t.IsZero() {
			return 0
		}
		return t.Sub(sigterm)
	}
	res.Upgraded = since(old.firstAt("Upgraded", sigterm))
	res.Returned = res.Upgraded
	if res.Returned == 0 {
		res.Returned = since(old.firstAt("Reconciler error", sigterm))
	}
	if n := len(old.lines); n > 0 {
		res.Stop = since(lineAt(old.lines[n-1]))
	}
	res.ExitCode = old.exitCode()
	res.Deployed = res.Upgraded
	if res.Deployed == 0 {
		res.Deployed = since(next.firstAt("Upgraded", sigterm))
	}
	for _, e := range old.lines {
		switch e["msg"] {
		case "Handed the lease over":
			res.HandedOver = true
			c, _ := e["claims"].(float64)
			res.Claims = int(c)
		case "Claimed work finished":
			res.ClaimedWorkFinished = true
		}
	}
	res.Acquired = since(next.firstAt("Successfully acquired lease", sigterm))
	res.HolderSeen = since(heldSince)
	res.FirstDone = since(next.firstAt("Reconcile successful", sigterm))
	for _, e := range next.lines {
		msg, _ := e["msg"].(string)
		errText, _ := e["error"].(string)
		res.ClaimWaits += boolInt(strings.HasPrefix(msg, "Object claimed by another replica"))
		res.OtherOps += boolInt(msg == "Reconciler error" && strings.Contains(errText, otherOperation))
		res.SuccessorUpgraded = res.SuccessorUpgraded || msg == "Upgraded"
	}
}

// lineAt is a log line's time; zero if it has none.
func lineAt(e map[string]any) time.Time {
	ts, _ := e["ts"].(string)
	t, _ := time.Parse(time.RFC3339Nano, ts)
	return t
}

// firstAt is the time of r's first line at or after from whose message begins with text (any
// case); zero if none.
func (r podRecord) firstAt(text string, from time.Time) time.Time {
	for _, e := range r.lines {
		msg, _ := e["msg"].(string)
		if t := lineAt(e); !t.Before(from) && len(msg) >= len(text) && strings.EqualFold(msg[:len(text)], text) {
			return t
		}
	}
	return time.Time{}
}

// helmState is the state of the release's revision rev in ns, as Helm's Secret labels it.
func helmState(ctx context.Context, ns string, rev int) (string, error) {
	l, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("owner=helm,name=%s,version=%d", helmRelease, rev),
	})
	if err != nil || len(l.Items) == 0 {
		return "", err
	}
	return l.Items[0].Labels["status"], nil
}

func helmLeadTable(res []*helmLeadResult) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(name string, f func(r *helmLeadResult) string) {
		cells := make([]string, 0, 1+len(res))
		cells = append(cells, name)
		for _, r := range res {
			cells = append(cells, f(r))
		}
		_, _ = fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	s := func(d time.Duration) string {
		if d == 0 {
			return "–"
		}
		return d.Round(10 * time.Millisecond).String()
	}
	row(fmt.Sprintf("U %d s, R %d s; from the old leader's SIGTERM (its log)", helmLeadU, helmLeadR), func(r *helmLeadResult) string { return r.Mode.label() })
	row("once the old leader exited: revision 2 (upgrade), 3 (rollback)", func(r *helmLeadResult) string {
		return fmt.Sprintf("%s, %s", r.Revision2, cmp.Or(r.Revision3, "none"))
	})
	row("release once the successor reconciled it", func(r *helmLeadResult) string {
		return fmt.Sprintf("%s, revision %d", r.AtTheEnd.State, r.AtTheEnd.Revision)
	})
	row("old leader's upgrade ended (\"Upgraded\")", func(r *helmLeadResult) string { return s(r.Upgraded) })
	row("old leader's reconcile returned", func(r *helmLeadResult) string { return s(r.Returned) })
	row("release deployed at the upgraded version (first \"Upgraded\")", func(r *helmLeadResult) string { return s(r.Deployed) })
	row("handover: successor's \"Successfully acquired lease\"", func(r *helmLeadResult) string { return s(r.Acquired) })
	row("lease's new holder seen (test's informer)", func(r *helmLeadResult) string { return s(r.HolderSeen) })
	row("successor's first \"Reconcile successful\"", func(r *helmLeadResult) string { return s(r.FirstDone) })
	row("successor's waits on the claim", func(r *helmLeadResult) string { return fmt.Sprint(r.ClaimWaits) })
	row("successor's \"another operation\" errors", func(r *helmLeadResult) string { return fmt.Sprint(r.OtherOps) })
	row("successor upgraded again", func(r *helmLeadResult) string { return fmt.Sprint(r.SuccessorUpgraded) })
	row("old leader: \"Handed the lease over\" (claims), \"Claimed work finished\"", func(r *helmLeadResult) string {
		return fmt.Sprintf("%t (%d), %t", r.HandedOver, r.Claims, r.ClaimedWorkFinished)
	})
	row("old leader's stop (SIGTERM → last line), exit code", func(r *helmLeadResult) string {
		return fmt.Sprintf("%s, %d", s(r.Stop), r.ExitCode)
	})
	row("lease holders", func(r *helmLeadResult) string { return strings.Join(r.Holders, " → ") })
	_ = w.Flush()
	return b.String()
}
