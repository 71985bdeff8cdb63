package runnable_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
	"github.com/quiesce-dev/quiesce/runnable"
)

// hookCall is one call of an OnAbandon hook: its request, when it came (from the stop),
// and the time its ctx left.
type hookCall struct {
	req    reconcile.Request
	at     time.Duration
	budget time.Duration
}

// hooks records the calls of OnAbandon hooks.
type hooks struct {
	mu    sync.Mutex
	calls []hookCall
}

func (h *hooks) record(begin *time.Time) func(context.Context, reconcile.Request) {
	return func(ctx context.Context, req reconcile.Request) {
		dl, _ := ctx.Deadline()
		h.mu.Lock()
		defer h.mu.Unlock()
		h.calls = append(h.calls, hookCall{req, time.Since(*begin), time.Until(dl)})
	}
}

func (h *hooks) get() []hookCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookCall(nil), h.calls...)
}

// reconcileBg runs rec's Reconcile of ns/name on a goroutine of its own, as a worker would.
func reconcileBg(rec reconcile.Reconciler, name string) {
	go func() {
		_, _ = rec.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}})
	}()
}

// lineWith returns the lines whose message is msg.
func linesWith(lines []string, msg string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, `"msg"="`+msg+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// GracePeriod 10s, CancelAfter 8s (the default). The helm controller keeps a 4s cleanup
// window: its reconcile, and the Call inside it, are cancelled at 6s, and the line says so;
// the plain controller's at 8s. The rollback outlives the grace period: the abandoned line
// marks the call's cleanup unfinished, and OnAbandon is called for its request within the
// budget of the Events (5s), before Start returns.
func TestCleanupWindowAndOnAbandon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.New(runnable.Options{Logger: logs.logger(), GracePeriod: 10 * time.Second})
		var begin time.Time
		var h hooks
		helmCut, plainCut := make(chan time.Duration, 1), make(chan time.Duration, 1)
		release := make(chan struct{})
		helm := reconcilers.Wrap(r.Executor(), "helm", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			return reconcile.Result{}, reconcilers.Call(ctx, "upgrade", func(ctx context.Context) error {
				<-ctx.Done()
				helmCut <- time.Since(begin)
				<-release // the atomic rollback outlives the grace period
				return nil
			})
		}), reconcilers.WrapOptions{Cleanup: 4 * time.Second, OnAbandon: h.record(&begin)})
		plain := reconcilers.Wrap(r.Executor(), "plain", reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
			<-ctx.Done()
			plainCut <- time.Since(begin)
			return reconcile.Result{}, ctx.Err()
		}), reconcilers.WrapOptions{OnAbandon: h.record(&begin)})
		ctx, stop := context.WithCancel(context.Background())
		result := make(chan error, 1)
		go func() { result <- r.Run(ctx) }()
		reconcileBg(helm, "a")
		reconcileBg(plain, "b")
		synctest.Wait()
		begin = time.Now()
		stop()
		err := <-result
		if took := time.Since(begin); took != 10*time.Second {
			t.Errorf("Start returned after %v, want at the end of the 10s grace period", took)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Start = %v, want the abandoned calls' error", err)
		}
		if at := <-helmCut; at != 6*time.Second {
			t.Errorf("the helm call was cancelled at %v, want at 6s: 10s grace - 4s cleanup", at)
		}
		if at := <-plainCut; at != 8*time.Second {
			t.Errorf("the plain reconcile was cancelled at %v, want at CancelAfter, 8s", at)
		}
		lines := logs.all()
		cut := linesWith(lines, "Cancelling calls still running")
		if len(cut) != 2 || !strings.Contains(cut[0], `"name"="helm/ns/a"`) || !strings.Contains(cut[0], `"name"="helm/ns/a/upgrade"`) ||
			!strings.Contains(cut[0], `"cleanup"="4s"`) || !strings.Contains(cut[0], "cleanup window") || strings.Contains(cut[0], "plain") ||
			!strings.Contains(cut[1], `"name"="plain/ns/b"`) || strings.Contains(cut[1], `"cleanup"`) {
			t.Errorf("cancel lines\n%s\nwant helm/ns/a and its Call at 6s with their 4s cleanup window, then plain/ns/b alone",
				strings.Join(cut, "\n"))
		}
		ab := linesWith(lines, runnable.AbandonedMessage)
		if len(ab) != 1 || !strings.Contains(ab[0], `"abandoned"=1`) ||
			!strings.Contains(ab[0], `"name"="helm/ns/a/upgrade"`) || !strings.Contains(ab[0], `"cleanupUnfinished"=true`) {
			t.Errorf("abandoned lines %q, want one naming helm/ns/a/upgrade, its cleanup unfinished", ab)
		}
		want := []hookCall{{reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}, 10 * time.Second, 5 * time.Second}}
		if got := h.get(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("OnAbandon calls %v, want %v: ns/a of helm alone, at 10s, with the 5s budget", got, want)
		}
		close(release)
		if err := r.Executor().Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// Once the lease is lost (the executor fenced), OnAbandon is not called: its skip is logged
// before Start returns, even by a sink slow to write it, and no hook is said to be running.
// Fails on the code that logged the skip on the hook's goroutine, no longer waited for once
// the fenced ctx ended: Start returned first, with "OnAbandon hooks still running".
func TestOnAbandonNotCalledAfterFence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.New(runnable.Options{Logger: logs.slowLogger(skipMessage, time.Second), GracePeriod: 10 * time.Second})
		var begin time.Time
		var h hooks
		release := make(chan struct{})
		helm := reconcilers.Wrap(r.Executor(), "helm", reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			<-release // ignores its context, even fenced
			return reconcile.Result{}, nil
		}), reconcilers.WrapOptions{Cleanup: 4 * time.Second, OnAbandon: h.record(&begin)})
		ctx, stop := context.WithCancel(context.Background())
		result := make(chan error, 1)
		go func() { result <- r.Run(ctx) }()
		reconcileBg(helm, "a")
		synctest.Wait()
		begin = time.Now()
		stop()
		time.Sleep(time.Second)
		internal.Of(r.Executor()).Fence(errors.New("lease lost"))
		if err := <-result; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Start = %v, want the abandoned call's error", err)
		}
		if got := h.get(); len(got) != 0 {
			t.Errorf("OnAbandon called after the fence: %v", got)
		}
		lines := logs.all()
		skipped := linesWith(lines, skipMessage)
		if len(skipped) != 1 || !strings.Contains(skipped[0], `"controller"="helm"`) || !strings.Contains(skipped[0], `"name"="a"`) ||
			!strings.Contains(skipped[0], "lease lost") {
			t.Errorf("skip lines %q, want one naming helm's ns/a and the cause", skipped)
		}
		if running := linesWith(lines, "OnAbandon hooks still running after their context ended: no longer waited for"); len(running) != 0 {
			t.Errorf("lines %q, want none: no hook ran", running)
		}
		close(release)
		if err := r.Executor().Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// skipMessage is the line of an OnAbandon hook skipped: the lease is lost.
const skipMessage = "Skipping OnAbandon: the lease is lost"

// slowLogger is c's logger, slow to write the lines whose message is msg: each takes d, on
// the bubble's fake clock. It is the sink of a loaded machine, for code that must wait for
// a line before it returns.
func (c *capture) slowLogger(msg string, d time.Duration) logr.Logger {
	return funcr.New(func(_, args string) {
		if strings.Contains(args, `"msg"="`+msg+`"`) {
			time.Sleep(d)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lines = append(c.lines, args)
	}, funcr.Options{})
}

// A panic in a hook is logged and stops nothing; a hook that blocks is bounded: its ctx
// ends with the budget of the Events (5s), and Start returns then.
func TestOnAbandonPanicAndBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		r := runnable.New(runnable.Options{Logger: logs.logger(), GracePeriod: 10 * time.Second})
		var begin time.Time
		release := make(chan struct{})
		hang := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			<-release
			return reconcile.Result{}, nil
		})
		panicky := reconcilers.Wrap(r.Executor(), "panicky", hang, reconcilers.WrapOptions{
			OnAbandon: func(context.Context, reconcile.Request) { panic("mark failed") },
		})
		type ended struct {
			at    time.Duration
			cause error
		}
		slowEnd := make(chan ended, 1)
		slow := reconcilers.Wrap(r.Executor(), "slow", hang, reconcilers.WrapOptions{
			OnAbandon: func(ctx context.Context, _ reconcile.Request) {
				<-ctx.Done()
				slowEnd <- ended{time.Since(begin), ctx.Err()}
			},
		})
		ctx, stop := context.WithCancel(context.Background())
		result := make(chan error, 1)
		go func() { result <- r.Run(ctx) }()
		reconcileBg(panicky, "p")
		reconcileBg(slow, "s")
		synctest.Wait()
		begin = time.Now()
		stop()
		if err := <-result; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Start = %v, want the abandoned calls' error", err)
		}
		if took := time.Since(begin); took != 15*time.Second {
			t.Errorf("Start returned after %v, want 15s: the 10s grace period and the 5s budget", took)
		}
		if e := <-slowEnd; e.at != 15*time.Second || !errors.Is(e.cause, context.DeadlineExceeded) {
			t.Errorf("the blocking hook's ctx ended at %v (%v), want at 15s, its deadline", e.at, e.cause)
		}
		p := linesWith(logs.all(), "OnAbandon panicked")
		if len(p) != 1 || !strings.Contains(p[0], `"controller"="panicky"`) || !strings.Contains(p[0], `"name"="p"`) ||
			!strings.Contains(p[0], "mark failed") {
			t.Errorf("panic lines %q, want one naming panicky's ns/p and the value", p)
		}
		close(release)
		if err := r.Executor().Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// A cleanup window that cannot fit the Runnable's grace period is refused at Wrap, naming
// the field; without a Runnable, Wrap cannot know the grace period and takes it.
func TestCleanupThatCannotFitPanicsAtWrap(t *testing.T) {
	noop := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil })
	r := runnable.New(runnable.Options{GracePeriod: 10 * time.Second})
	for _, tc := range []struct {
		ex      *drain.Executor
		cleanup time.Duration
		want    string // "": no panic
	}{
		{r.Executor(), 10 * time.Second, "WrapOptions.Cleanup (10s) must be below the Runnable's GracePeriod (10s)"},
		{r.Executor(), time.Minute, "WrapOptions.Cleanup (1m0s) must be below"},
		{r.Executor(), -time.Second, "WrapOptions.Cleanup is -1s"},
		{drain.New(drain.Options{}), -time.Second, "WrapOptions.Cleanup is -1s"},
		{r.Executor(), 9 * time.Second, ""},
		{drain.New(drain.Options{}), time.Minute, ""},
	} {
		func() {
			defer func() {
				v := recover()
				if got := fmt.Sprint(v); tc.want == "" && v != nil || tc.want != "" && !strings.Contains(got, tc.want) {
					t.Errorf("Wrap with Cleanup %v panicked with %v, want %q", tc.cleanup, v, tc.want)
				}
			}()
			reconcilers.Wrap(tc.ex, "helm", noop, reconcilers.WrapOptions{Cleanup: tc.cleanup})
		}()
	}
	defer func() {
		if v := recover(); !strings.Contains(fmt.Sprint(v), "WrapOptions.OnAbandon needs reconcile.Request requests") {
			t.Errorf("WrapTyped with OnAbandon and string requests panicked with %v, want it refused", v)
		}
	}()
	reconcilers.WrapTyped(r.Executor(), "typed", reconcile.TypedFunc[string](func(context.Context, string) (reconcile.Result, error) {
		return reconcile.Result{}, nil
	}), reconcilers.WrapOptions{OnAbandon: func(context.Context, reconcile.Request) {}})
}
