package suite_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/drain/draintest"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

const (
	heartbeatAnnotation = "quiesce.dev/heartbeat"
	heartbeatFinalizer  = "quiesce.dev/heartbeat"
)

// heartbeats is a controller with a daemon per ConfigMap that writes a heartbeat
// annotation every 100ms, and a finalizer released once the daemon stopped. The daemon of a
// ConfigMap named "stuck" ignores its context until hold is closed.
type heartbeats struct {
	client.Client
	daemons *reconcilers.Daemons
	hold    <-chan struct{}

	mu      sync.Mutex
	beats   map[string]*atomic.Int32
	journal []string
}

func (h *heartbeats) note(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.journal = append(h.journal, s)
}

func (h *heartbeats) notes() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.journal...)
}

// beatsOf returns how many heartbeats the daemon of the ConfigMap name wrote.
func (h *heartbeats) beatsOf(name string) int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.beats[name]; b != nil {
		return b.Load()
	}
	return 0
}

func (h *heartbeats) counter(name string) *atomic.Int32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.beats[name] == nil {
		h.beats[name] = &atomic.Int32{}
	}
	return h.beats[name]
}

func (h *heartbeats) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var cm corev1.ConfigMap
	if err := h.Get(ctx, req.NamespacedName, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			_, err = h.daemons.Stop(ctx, req.NamespacedName, "heartbeat")
		}
		return reconcile.Result{}, err
	}
	if !cm.DeletionTimestamp.IsZero() {
		stopped, err := h.daemons.Stop(ctx, req.NamespacedName, "heartbeat")
		if err != nil || !stopped {
			return reconcile.Result{RequeueAfter: time.Second}, err
		}
		if controllerutil.RemoveFinalizer(&cm, heartbeatFinalizer) {
			if err := h.Update(ctx, &cm); err != nil {
				return reconcile.Result{}, err
			}
			h.note(cm.Name + " released")
		}
		return reconcile.Result{}, nil
	}
	if controllerutil.AddFinalizer(&cm, heartbeatFinalizer) {
		if err := h.Update(ctx, &cm); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, h.daemons.Ensure(ctx, &cm, "heartbeat", h.heartbeat(req.NamespacedName))
}

// heartbeat returns the daemon of the ConfigMap key.
func (h *heartbeats) heartbeat(key types.NamespacedName) func(context.Context) error {
	if key.Name == "stuck" {
		return func(context.Context) error {
			<-h.hold // ignores its context
			return nil
		}
	}
	beats := h.counter(key.Name)
	return func(ctx context.Context) error {
		defer h.note(key.Name + " stopped")
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			n := beats.Add(1)
			patch := []byte(`{"metadata":{"annotations":{"` + heartbeatAnnotation + `":"` + strconv.Itoa(int(n)) + `"}}}`)
			cm := &corev1.ConfigMap{}
			cm.Namespace, cm.Name = key.Namespace, key.Name
			if err := h.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("failed to write heartbeat: %w", err)
			}
		}
	}
}

// startHeartbeats starts a manager in ns with the heartbeats controller and returns it.
func startHeartbeats(ns string, logs *logLines, hold <-chan struct{}, opts runnable.Options) (
	h *heartbeats, q *runnable.Runnable, stop context.CancelFunc, done <-chan error,
) {
	GinkgoHelper()
	opts.Logger = logs.logger()
	mgr, q, err := newQuiesced(opts, inNamespace(ns))
	Expect(err).NotTo(HaveOccurred())
	h = &heartbeats{
		Client:  mgr.GetClient(),
		daemons: reconcilers.NewDaemons(q.Executor(), "daemons", reconcilers.DaemonsOptions{Logger: logs.logger()}),
		hold:    hold,
		beats:   map[string]*atomic.Int32{},
	}
	Expect(ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Named("daemons").
		Complete(reconcilers.Wrap(q.Executor(), "daemons", h, reconcilers.WrapOptions{}))).To(Succeed())
	stop, done = startManager(mgr)
	return h, q, stop, done
}

// daemonNames returns the names of ex's pending daemons. Reconciles are left out: every
// heartbeat changes its ConfigMap, so one may be in flight at any moment.
func daemonNames(ex *drain.Executor) []string {
	var out []string
	for _, p := range ex.Pending() {
		if p.Daemon {
			out = append(out, p.Name)
		}
	}
	return out
}

var _ = Describe("Daemons", func() {
	It("should stop a deleted object's daemon before its finalizer is released, and every daemon when the manager stops",
		func(ctx SpecContext) {
			cur := goleak.IgnoreCurrent()
			ns := newNamespace(ctx)
			var logs logLines
			h, q, stop, done := startHeartbeats(ns, &logs, nil, runnable.Options{
				ReportAfter: 300 * time.Millisecond,
			})
			names := []string{"cm-0", "cm-1", "cm-2"}
			deleted := names[0]
			for _, name := range names {
				configMap(ctx, ns, name)
			}

			By("running one daemon per ConfigMap, each writing its heartbeat")
			for _, name := range names {
				Eventually(func(g Gomega) {
					var cm corev1.ConfigMap
					g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &cm)).To(Succeed())
					g.Expect(cm.Annotations).To(HaveKey(heartbeatAnnotation))
					g.Expect(cm.Finalizers).To(ContainElement(heartbeatFinalizer))
				}).Should(Succeed())
			}
			Expect(daemonNames(q.Executor())).To(ConsistOf(
				"daemons/"+ns+"/cm-0/heartbeat", "daemons/"+ns+"/cm-1/heartbeat", "daemons/"+ns+"/cm-2/heartbeat"))

			By("deleting one: its daemon stops, then its finalizer is released")
			cm0 := &corev1.ConfigMap{}
			Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: deleted}, cm0)).To(Succeed())
			Expect(k8sClient.Delete(ctx, cm0)).To(Succeed())
			Eventually(func() error {
				return k8sClient.Get(ctx, client.ObjectKeyFromObject(cm0), &corev1.ConfigMap{})
			}, 10*time.Second).Should(Satisfy(apierrors.IsNotFound))
			Eventually(h.notes).Should(Equal([]string{"cm-0 stopped", "cm-0 released"}))
			beats0, beats1 := h.beatsOf(deleted), h.beatsOf("cm-1")
			Consistently(func() int32 { return h.beatsOf(deleted) }, 500*time.Millisecond).Should(Equal(beats0))
			Expect(h.beatsOf("cm-1")).To(BeNumerically(">", beats1), "the others beat on")
			Expect(daemonNames(q.Executor())).To(ConsistOf("daemons/"+ns+"/cm-1/heartbeat", "daemons/"+ns+"/cm-2/heartbeat"))

			By("stopping the manager: every daemon stops at once, and the drain reports nothing")
			stop()
			Eventually(done, 20*time.Second).Should(Receive(BeNil()))
			Expect(q.Err()).NotTo(HaveOccurred())
			draintest.VerifyNone(GinkgoT(), q.Executor())
			Expect(h.notes()).To(ConsistOf("cm-0 stopped", "cm-0 released", "cm-1 stopped", "cm-2 stopped"))
			beats1, beats2 := h.beatsOf("cm-1"), h.beatsOf("cm-2")
			Consistently(func() []int32 { return []int32{h.beatsOf("cm-1"), h.beatsOf("cm-2")} }, 300*time.Millisecond).
				Should(Equal([]int32{beats1, beats2}))
			Expect(logs.messages()).To(Equal(append(stopBegins(), "All calls returned")),
				"no report, no restart: every daemon honoured its context")
			expectNoLeaks(cur)
		})

	It("should name the daemon that ignores its context when the grace period ends", func(ctx SpecContext) {
		cur := goleak.IgnoreCurrent()
		ns := newNamespace(ctx)
		var logs logLines
		hold, release := releaser()
		h, q, stop, done := startHeartbeats(ns, &logs, hold, runnable.Options{
			ReportAfter: 500 * time.Millisecond, ReportEvery: time.Second,
			GracePeriod: 2 * time.Second,
		})
		for _, name := range []string{"cm-0", "cm-1", "stuck"} {
			configMap(ctx, ns, name)
		}
		stuck := "daemons/" + ns + "/stuck/heartbeat"
		Eventually(func() []string { return daemonNames(q.Executor()) }).Should(ConsistOf(
			"daemons/"+ns+"/cm-0/heartbeat", "daemons/"+ns+"/cm-1/heartbeat", stuck))
		Eventually(func() int32 { return h.beatsOf("cm-1") }).Should(BeNumerically(">", 0))

		stop()
		Eventually(done, 20*time.Second).Should(Receive(BeNil()))
		var pe *drain.PendingError
		Expect(errors.As(q.Err(), &pe)).To(BeTrue(), "main learns that a daemon was abandoned: %v", q.Err())
		Expect(pe.Pending).To(ConsistOf(HaveField("Name", stuck)))
		Expect(h.notes()).To(ConsistOf("cm-0 stopped", "cm-1 stopped"))

		// quiesce's own lines: the daemons log through the same logger, with their daemon's
		// name (client-go, for one, may log a request cut by the drain's cancellation).
		var lines, msgs []string
		for _, line := range logs.all() {
			if !strings.Contains(line, `"daemon"="heartbeat"`) {
				lines = append(lines, line)
				_, rest, _ := strings.Cut(line, `"msg"="`)
				msg, _, _ := strings.Cut(rest, `"`)
				msgs = append(msgs, msg)
			}
		}
		Expect(msgs[:2]).To(Equal(stopBegins()))
		Expect(msgs[len(msgs)-1]).To(Equal("Abandoned calls still running after the grace period"))
		Expect(msgs[2 : len(msgs)-1]).To(HaveEach("Waiting for pending calls"))
		for _, line := range lines[2:] {
			Expect(line).To(ContainSubstring(`"name"="` + stuck + `"`))
			Expect(line).NotTo(ContainSubstring("/cm-"), "only the daemon that ignores its context is named")
		}
		for _, report := range lines[2 : len(lines)-1] {
			Expect(report).To(ContainSubstring(`"daemon"=true`))
		}

		release()
		Eventually(q).Should(draintest.HaveNoPendingCalls())
		expectNoLeaks(cur)
	})
})
