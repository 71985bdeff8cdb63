package test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"

	"github.com/quiesce-dev/quiesce/shutdowntest"

	"example.com/helm-operator/controller"
)

// scale is what one second of issue 49's table takes here: every duration of a case (the
// upgrade U, the rollback R, the stop 3 s into the upgrade, Helm's 10 min timeout, quiesce's
// and the manager's budgets, quiesce's reports, the restarted operator's watch) is scaled
// down by this one factor (Helm's poll by more: helmPoll), so that the order of events,
// which decides each cell, is the issue's.
const scale = 200 * time.Millisecond

// s is n seconds of the issue, scaled.
func s(n float64) time.Duration { return time.Duration(n * float64(scale)) }

// helmPoll is how often Helm's wait polls here: Helm's 2 s, scaled, would be 400 ms, as long
// as the shortest rollback (R 2 s): a cell would then be decided by where a poll falls, not by
// U and R. 100 ms is half a second of the issue.
const helmPoll = 100 * time.Millisecond

// otherOperation is Helm's error for a release left pending-install, pending-upgrade or
// pending-rollback: every upgrade of it fails with it until someone rolls it back by hand.
const otherOperation = "another operation (install/upgrade/rollback) is in progress"

// budget is a case's stop configuration: quiesce's (unused by plain controller-runtime) and
// the manager's.
type budget struct {
	GracePeriod, CancelAfter, GracefulShutdownTimeout time.Duration
	// Args are further flags of the operator: its cleanup window (--cleanup, quiesce's
	// reconcilers.WrapOptions.Cleanup) and abandon hook (--mark-failed-on-abandon, OnAbandon).
	Args []string
}

var (
	// plain is controller-runtime's default GracefulShutdownTimeout, 30 s.
	plain = budget{GracefulShutdownTimeout: s(30)}
	// defaults are quiesce's defaults: GracePeriod 25 s, cancel at 4/5 of it, 20 s; the
	// manager's 30 s.
	defaults = budget{GracePeriod: s(25), CancelAfter: s(20), GracefulShutdownTimeout: s(30)}
	// longer is a budget long enough for the upgrade itself (issue 49's last row): GracePeriod
	// 80 s, cancel at 60 s, the manager's 85 s.
	longer = budget{GracePeriod: s(80), CancelAfter: s(60), GracefulShutdownTimeout: s(85)}
	// cleanup is docs/stop-policy.md's worked example: a cleanup window of 60 s in a
	// GracePeriod of 90 s (CancelAfter its default, 4/5), the manager's 100 s: the upgrade is
	// cancelled at 90 - 60 = 30 s, its rollback has until 90 s.
	cleanup = budget{GracePeriod: s(90), CancelAfter: s(72), GracefulShutdownTimeout: s(100),
		Args: []string{"--cleanup=" + s(60).String()}}
	// plainLonger is plain controller-runtime under cleanup's manager timeout.
	plainLonger = budget{GracefulShutdownTimeout: s(100)}
	// markFailed is defaults with the operator's OnAbandon hook: mark the release failed.
	markFailed = budget{GracePeriod: s(25), CancelAfter: s(20), GracefulShutdownTimeout: s(30),
		Args: []string{"--mark-failed-on-abandon"}}
)

// stopCase is one cell of the table: the upgrade takes U seconds (of the issue) and its atomic
// rollback R; the operator runs with quiesce or without, under budget.
type stopCase struct {
	U, R    float64
	Quiesce bool
	Budget  budget
}

// outcome is what a stop 3 s into pending-upgrade left and logged.
type outcome struct {
	// State, Revision and Version (the chart value: "2" once the upgrade finished, "1" once
	// rolled back) are the release's last record's, once the operator exited.
	State    string
	Revision int
	Version  string
	// OtherOps counts the restarted operator's otherOperation errors in restartWatch.
	OtherOps int
	// Took is SIGTERM to exit; ExitCode the operator's.
	Took     time.Duration
	ExitCode int
	// GaveUp: the manager gave up at GracefulShutdownTimeout (plain controller-runtime).
	GaveUp bool
	// Abandoned are the calls quiesce named as abandoned at the end of its grace period.
	Abandoned []string
	// Cancelled: quiesce logged "Cancelling calls still running" (at CancelAfter).
	Cancelled bool
	// Reported: a report of pending calls named the upgrade with its line in release.go.
	Reported bool
	// Marked: the operator's OnAbandon hook marked the release failed.
	Marked bool
}

func (o outcome) String() string {
	return fmt.Sprintf("state %s (revision %d, version %s), %d %q errors after restart, stop %v (exit %d), gave up %t, abandoned %v, cancelled %t, reported %t, marked failed %t",
		o.State, o.Revision, o.Version, o.OtherOps, otherOperation, o.Took.Round(time.Millisecond), o.ExitCode, o.GaveUp, o.Abandoned, o.Cancelled, o.Reported, o.Marked)
}

// restartWatch is how long the restarted operator is watched for otherOperation errors.
var restartWatch = s(25)

// want is what a cell must show.
type want struct {
	State string
	// Version is the last record's chart value: "2" the upgrade finished, "1" rolled back.
	Version string
	// Stuck: the restarted operator fails with otherOperation (at least once in restartWatch).
	Stuck     bool
	Abandoned bool
	Cancelled bool
	GaveUp    bool
	// Marked: the OnAbandon hook marked the release failed.
	Marked bool
	// TookAtLeast bounds the stop (SIGTERM to exit) from below; from above, the manager's
	// GracefulShutdownTimeout does (with a margin for the machine's load).
	TookAtLeast time.Duration
}

var _ = Describe("A Helm operator stopped 3 s into pending-upgrade", func() {
	DescribeTable("should leave the release as issue 49 measured",
		func(ctx SpecContext, c stopCase, w want) {
			cur := goleak.IgnoreCurrent()
			DeferCleanup(func() {
				Eventually(func() error { return goleak.Find(cur) }).Should(Succeed())
			})
			o := runStop(ctx, c)
			AddReportEntry("outcome", o.String(), ReportEntryVisibilityAlways)

			Expect(o.State).To(Equal(w.State), "the release's state after the stop")
			Expect(o.Version).To(Equal(w.Version), "the release's version after the stop")
			Expect(o.Marked).To(Equal(w.Marked), "the OnAbandon hook marked the release failed")
			if w.Stuck {
				Expect(o.OtherOps).To(BeNumerically(">", 0), "the restarted operator's %q errors", otherOperation)
			} else {
				Expect(o.OtherOps).To(BeZero(), "the restarted operator's %q errors", otherOperation)
			}
			Expect(o.GaveUp).To(Equal(w.GaveUp), "the manager gave up at GracefulShutdownTimeout")
			Expect(o.Took).To(And(BeNumerically(">=", w.TookAtLeast), BeNumerically("<", c.Budget.GracefulShutdownTimeout+10*time.Second)),
				"the stop's duration")
			if !c.Quiesce {
				Expect(o.Abandoned).To(BeEmpty())
				Expect(o.Reported).To(BeFalse())
				return
			}
			// quiesce names the upgrade while it waits for it, with its line in release.go.
			Expect(o.Reported).To(BeTrue(), "a report named the upgrade with its line")
			Expect(o.Cancelled).To(Equal(w.Cancelled), "quiesce cancelled the upgrade at CancelAfter")
			if w.Abandoned {
				Expect(o.Abandoned).To(ContainElement(HaveSuffix("/upgrade")))
				Expect(o.ExitCode).To(Equal(1))
			} else {
				Expect(o.Abandoned).To(BeEmpty())
				Expect(o.ExitCode).To(Equal(0))
			}
		},
		// U 10 s, R 45 s: plain cancels at once, the 45 s rollback outlives its 30 s; quiesce
		// lets the upgrade finish (7 s after the stop, before the cancel at 20 s).
		Entry("should leave plain controller-runtime pending-rollback (U 10 s, R 45 s)",
			stopCase{U: 10, R: 45, Budget: plain},
			want{State: pendingRollback, Version: "1", Stuck: true, GaveUp: true, TookAtLeast: s(30)}),
		Entry("should let quiesce finish the upgrade: deployed (U 10 s, R 45 s)",
			stopCase{U: 10, R: 45, Quiesce: true, Budget: defaults},
			want{State: deployed, Version: "2", TookAtLeast: s(10 - 3)}),
		// U 45 s, R 45 s: quiesce cancels at 20 s; the rollback has 5 s of its 45: abandoned.
		Entry("should leave plain controller-runtime pending-rollback (U 45 s, R 45 s)",
			stopCase{U: 45, R: 45, Budget: plain},
			want{State: pendingRollback, Version: "1", Stuck: true, GaveUp: true, TookAtLeast: s(30)}),
		Entry("should leave quiesce's abandoned rollback pending (U 45 s, R 45 s)",
			stopCase{U: 45, R: 45, Quiesce: true, Budget: defaults},
			want{State: pendingRollback, Version: "1", Stuck: true, Abandoned: true, Cancelled: true, TookAtLeast: s(25)}),
		// U 60 s, R 2 s: both roll back; plain at once, quiesce from its cancel at 20 s, with
		// 5 s left of its grace period for the 2 s rollback (plain: 30 s).
		Entry("should let plain controller-runtime roll back (U 60 s, R 2 s)",
			stopCase{U: 60, R: 2, Budget: plain},
			want{State: deployed, Version: "1", TookAtLeast: s(2)}),
		Entry("should let quiesce roll back after its cancel (U 60 s, R 2 s)",
			stopCase{U: 60, R: 2, Quiesce: true, Budget: defaults},
			want{State: deployed, Version: "1", Cancelled: true, TookAtLeast: s(20 + 2)}),
		// U 60 s, R 45 s: neither fits the defaults.
		Entry("should leave plain controller-runtime pending-rollback (U 60 s, R 45 s)",
			stopCase{U: 60, R: 45, Budget: plain},
			want{State: pendingRollback, Version: "1", Stuck: true, GaveUp: true, TookAtLeast: s(30)}),
		Entry("should leave quiesce's abandoned rollback pending (U 60 s, R 45 s)",
			stopCase{U: 60, R: 45, Quiesce: true, Budget: defaults},
			want{State: pendingRollback, Version: "1", Stuck: true, Abandoned: true, Cancelled: true, TookAtLeast: s(25)}),
		// The abandon hook: the release it cannot save is marked failed, not left pending, so
		// the next operator upgrades it instead of failing on "another operation".
		Entry("should let quiesce's abandon hook mark the release failed (U 60 s, R 45 s)",
			stopCase{U: 60, R: 45, Quiesce: true, Budget: markFailed},
			want{State: failed, Version: "1", Abandoned: true, Cancelled: true, Marked: true, TookAtLeast: s(25)}),
		// A budget long enough for the work: the upgrade finishes, 42 s after the stop.
		Entry("should let quiesce finish the upgrade under a longer budget (U 45 s, R 45 s)",
			stopCase{U: 45, R: 45, Quiesce: true, Budget: longer},
			want{State: deployed, Version: "2", TookAtLeast: s(45 - 3)}),
		// The cleanup window (GracePeriod 90 s, Cleanup 60 s): the upgrade is cancelled at 30 s,
		// its 45 s rollback ends at 75 s, within the grace period: rolled back, nothing pending.
		Entry("should let quiesce's cleanup window finish the rollback (U 45 s, R 45 s)",
			stopCase{U: 45, R: 45, Quiesce: true, Budget: cleanup},
			want{State: deployed, Version: "1", Cancelled: true, TookAtLeast: s(30 + 45)}),
		Entry("should let quiesce's cleanup window finish the rollback (U 60 s, R 45 s)",
			stopCase{U: 60, R: 45, Quiesce: true, Budget: cleanup},
			want{State: deployed, Version: "1", Cancelled: true, TookAtLeast: s(30 + 45)}),
		// Plain controller-runtime under the same manager timeout: rolled back too, at once.
		Entry("should let plain controller-runtime roll back under a longer timeout (U 45 s, R 45 s)",
			stopCase{U: 45, R: 45, Budget: plainLonger},
			want{State: deployed, Version: "1", TookAtLeast: s(45)}),
	)
})

// The release states the cells end in, as Helm's Secret driver labels them.
const (
	deployed        = "deployed"
	pendingRollback = "pending-rollback"
	failed          = "failed"
)

// release is the release (and ConfigMap) name of every case: each runs in a namespace of its own.
const release = "work"

// runStop runs one case: the operator installs the release at version 1, upgrades it to
// version 2, and is stopped 3 s into pending-upgrade; then a second operator (the restart)
// runs for restartWatch. The test completes the chart's Jobs (envtest runs no Job controller):
// the install's at once, the upgrade's U after it appeared, the rollback's R after it appeared.
func runStop(ctx context.Context, c stopCase) outcome {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "helm-"}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())

	jobsCtx, stopJobs := context.WithCancel(ctx)
	var jobs sync.WaitGroup
	jobs.Go(func() { completeJobs(jobsCtx, ns.Name, s(c.U), s(c.R)) })
	DeferCleanup(func() { stopJobs(); jobs.Wait() })

	op := start(ctx, c, ns.Name, "stopped | ")
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: release, Namespace: ns.Name, Labels: map[string]string{controller.LabelKey: "true"}},
		Data:       map[string]string{"version": "1"},
	}
	Expect(k8sClient.Create(ctx, cm)).To(Succeed())
	Eventually(lastRelease).WithContext(ctx).WithArguments(ns.Name).WithTimeout(time.Minute).
		Should(Equal(record{Revision: 1, State: deployed, Version: "1"}), "the install")

	cm.Data["version"] = "2"
	Expect(k8sClient.Update(ctx, cm)).To(Succeed())
	Eventually(lastRelease).WithContext(ctx).WithArguments(ns.Name).WithTimeout(time.Minute).
		WithPolling(10*time.Millisecond).Should(Equal(record{Revision: 2, State: "pending-upgrade", Version: "2"}), "the upgrade")
	// The stop comes 3 s into pending-upgrade: the case's chosen moment, not a wait for a state.
	select {
	case <-time.After(s(3)):
	case <-ctx.Done():
	}
	res, err := op.Stop(ctx)
	Expect(err).NotTo(HaveOccurred())

	last, err := lastRelease(ctx, ns.Name)
	Expect(err).NotTo(HaveOccurred())
	o := outcome{
		State: last.State, Revision: last.Revision, Version: last.Version,
		Took: res.Took, ExitCode: res.ExitCode, GaveUp: res.GaveUp, Abandoned: res.Abandoned,
	}
	reported := regexp.MustCompile(`Waiting for pending calls.*release/` + ns.Name + `/` + release + `/upgrade.*release\.go:\d+`)
	for _, l := range res.Lines {
		o.Cancelled = o.Cancelled || strings.Contains(l, "Cancelling calls still running")
		o.Reported = o.Reported || reported.MatchString(l)
		o.Marked = o.Marked || strings.Contains(l, "Marked the release failed")
	}

	// The restart: a new operator, as the Deployment's next pod, for restartWatch.
	again := start(ctx, c, ns.Name, "restarted | ")
	select {
	case <-time.After(restartWatch):
	case <-ctx.Done():
	}
	again.Kill()
	for _, l := range again.Lines() {
		if strings.Contains(l, "Reconciler error") && strings.Contains(l, otherOperation) {
			o.OtherOps++
		}
	}
	return o
}

// start runs the operator's binary for c, on namespace's ConfigMaps alone (the other cases'
// releases are left as they ended: a stuck one would fail this case's count).
func start(ctx context.Context, c stopCase, namespace, prefix string) *shutdowntest.Operator {
	args := []string{
		"--namespace=" + namespace,
		"--quiesce=" + strconv.FormatBool(c.Quiesce),
		"--graceful-shutdown-timeout=" + c.Budget.GracefulShutdownTimeout.String(),
		"--chart-timeout=" + s(600).String(),
		"--helm-poll-interval=" + helmPoll.String(),
	}
	if c.Quiesce {
		args = append(args,
			"--quiesce-grace-period="+c.Budget.GracePeriod.String(),
			"--quiesce-cancel-after="+c.Budget.CancelAfter.String(),
			"--quiesce-report-after="+s(1).String(),
			"--quiesce-report-every="+s(5).String())
	}
	op, err := shutdowntest.Start(ctx, shutdowntest.Options{
		Binary: operator, Env: testEnv, Output: GinkgoWriter, LogPrefix: prefix,
		Flags: func(e shutdowntest.Endpoints) []string {
			return []string{"--metrics-bind-address=" + e.Metrics, "--health-probe-bind-address=" + e.Probe,
				"--quiesce-debug-address=" + e.Debug}
		},
		Args:        append(args, c.Budget.Args...),
		StopTimeout: c.Budget.GracefulShutdownTimeout + 30*time.Second,
	})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(op.Kill)
	return op
}

// record is a release's revision, state and chart value version, as Helm's storage reads it.
type record struct {
	Revision int
	State    string
	Version  string
}

// lastRelease is the release's last record in namespace, read through Helm's own storage.
func lastRelease(_ context.Context, namespace string) (record, error) {
	last, err := storage.Init(driver.NewSecrets(clientset.CoreV1().Secrets(namespace))).Last(release)
	if err != nil {
		return record{}, err
	}
	version, _ := last.Config["version"].(string)
	return record{Revision: last.Version, State: last.Info.Status.String(), Version: version}, nil
}

// completeJobs stands for the Job controller that envtest lacks: it completes each Job of the
// release in namespace when due, until ctx ends. The install's Job ("work-work-1", first seen)
// at once; the upgrade's ("work-work-2") u after it appeared; the rollback's ("work-work-1"
// again, a new Job) r after it appeared.
func completeJobs(ctx context.Context, namespace string, u, r time.Duration) {
	due := map[types.UID]time.Time{}
	seen := map[string]int{}
	_ = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var list batchv1.JobList
		if err := k8sClient.List(ctx, &list, client.InNamespace(namespace)); err != nil {
			return false, nil // the next poll tries again
		}
		for i := range list.Items {
			job := &list.Items[i]
			if _, ok := due[job.UID]; !ok {
				seen[job.Name]++
				after := u
				if strings.HasSuffix(job.Name, "-work-1") {
					after = 0
					if seen[job.Name] > 1 {
						after = r
					}
				}
				due[job.UID] = time.Now().Add(after)
			}
			if job.Status.Succeeded > 0 || time.Now().Before(due[job.UID]) {
				continue
			}
			if err := complete(ctx, job); err != nil && !apierrors.IsNotFound(err) {
				GinkgoWriter.Printf("failed to complete job %s: %v\n", job.Name, err)
			}
		}
		return false, nil
	})
}

// complete sets job's status as the Job controller does when its one pod succeeded.
func complete(ctx context.Context, job *batchv1.Job) error {
	now := metav1.Now()
	job.Status.StartTime = &job.CreationTimestamp
	job.Status.CompletionTime = &now
	job.Status.Succeeded = 1
	job.Status.Conditions = append(job.Status.Conditions,
		batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
		batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now})
	return k8sClient.Status().Update(ctx, job)
}
