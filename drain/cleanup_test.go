package drain_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// cancellingLine is the message of the line naming the calls the drain cancels.
const cancellingLine = "Cancelling calls still running"

// cleanupLine is a cancel line with the cleanup windows of its calls.
type cleanupLine struct {
	Cancelled int    `json:"cancelled"`
	Cause     string `json:"cause"`
	Calls     []struct {
		Name    string `json:"name"`
		Cleanup string `json:"cleanup"`
	} `json:"calls"`
	raw string
}

// cancelled is when, from the drain's start, a call's context ended, and why.
type cancelled struct {
	after time.Duration
	cause error
}

// goUntilCancelled starts a call of core shaped by o that reports on ends when its
// context ends, then runs on for cleanup before it returns.
func goUntilCancelled(t *testing.T, core internal.Core, o internal.CallOptions, begin *time.Time,
	cleanup time.Duration, ends chan<- cancelled,
) {
	t.Helper()
	if err := core.Go(context.Background(), o, func(ctx context.Context) error {
		<-ctx.Done()
		ends <- cancelled{time.Since(*begin), context.Cause(ctx)}
		time.Sleep(cleanup) // the cleanup: a rollback
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// Under an owner whose grace period is 10s, with CancelAfter 8s: a call with a cleanup
// window of 4s is cancelled at 6s, so that its cleanup fits before the abandon; one whose
// window CancelAfter leaves anyway (1s) and one without a window are cancelled at 8s.
// Each cancel line names its calls, with the window of those that have one.
func TestCleanupWindowCancelsEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: 8 * time.Second, ReportAfter: time.Minute})
		core := internal.Of(ex)
		core.Settings().Owned, core.Settings().Grace = true, 10*time.Second
		core.Settings().Cleanups.Store("helm", 4*time.Second)
		core.Settings().Cleanups.Store("short", time.Second)
		var begin time.Time
		helm, short, plain := make(chan cancelled, 1), make(chan cancelled, 1), make(chan cancelled, 1)
		goUntilCancelled(t, core, internal.CallOptions{Name: "helm/ns/a", Controller: "helm"}, &begin, 3*time.Second, helm)
		goUntilCancelled(t, core, internal.CallOptions{Name: "short/ns/b", Controller: "short"}, &begin, 0, short)
		goUntilCancelled(t, core, internal.CallOptions{Name: "plain/ns/c"}, &begin, 0, plain)
		synctest.Wait()
		begin = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ex.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took != 9*time.Second {
			t.Errorf("Drain took %v, want 9s: the 4s window's call cancelled at 6s, its cleanup 3s", took)
		}
		if c := <-helm; c.after != 6*time.Second || !strings.Contains(c.cause.Error(), "cleanup window") {
			t.Errorf("the call with a 4s window was cancelled at %v (%v); want at 6s, the cause naming its cleanup window", c.after, c.cause)
		}
		for name, ch := range map[string]chan cancelled{"short": short, "plain": plain} {
			if c := <-ch; c.after != 8*time.Second || strings.Contains(c.cause.Error(), "cleanup") {
				t.Errorf("%s was cancelled at %v (%v); want at CancelAfter, 8s, as any call", name, c.after, c.cause)
			}
		}
		var cut []cleanupLine
		for _, l := range lines.get() {
			if l.Msg == cancellingLine {
				c := cleanupLine{raw: l.raw}
				if err := json.Unmarshal([]byte(l.raw), &c); err != nil {
					t.Fatal(err)
				}
				cut = append(cut, c)
			}
		}
		if len(cut) != 2 {
			t.Fatalf("cancel lines %v, want 2", cut)
		}
		if c := cut[0]; c.Cancelled != 1 || len(c.Calls) != 1 || c.Calls[0].Name != "helm/ns/a" || c.Calls[0].Cleanup != "4s" ||
			!strings.Contains(c.Cause, "cleanup window") {
			t.Errorf("first cancel line %s; want helm/ns/a alone, its cleanup 4s, the cause naming the window", c.raw)
		}
		if c := cut[1]; c.Cancelled != 2 || len(c.Calls) != 2 || c.Calls[0].Name != "short/ns/b" || c.Calls[0].Cleanup != "1s" ||
			c.Calls[1].Name != "plain/ns/c" || c.Calls[1].Cleanup != "" {
			t.Errorf("second cancel line %s; want short/ns/b (cleanup 1s) and plain/ns/c (none)", c.raw)
		}
		if s := ex.Stats(); s.Cancelled != 3 {
			t.Errorf("Stats.Cancelled = %d, want 3", s.Cancelled)
		}
	})
}

// Without an owner, the time left until the first Drain's ctx deadline stands for the
// grace period: a 3s window under a 10s deadline is cancelled at 7s, even with CancelAfter
// never; without a deadline nothing is cancelled for a window. A call whose window does not
// fit is cancelled as the drain begins.
func TestCleanupWindowWithoutOwner(t *testing.T) {
	for _, tc := range []struct {
		name     string
		deadline time.Duration // 0: none
		cleanup  time.Duration
		want     time.Duration // when the call is cancelled; -1: never (it returns at 20s)
	}{
		{"deadline", 10 * time.Second, 3 * time.Second, 7 * time.Second},
		{"too long", 10 * time.Second, 30 * time.Second, 0},
		{"no deadline", 0, 3 * time.Second, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ex := drain.New(drain.Options{CancelAfter: -1})
				internal.Of(ex).Settings().Cleanups.Store("ctl", tc.cleanup)
				var begin time.Time
				var after time.Duration = -1
				var cause error
				if err := internal.Of(ex).Go(context.Background(), internal.CallOptions{Name: "ctl/x", Controller: "ctl"},
					func(ctx context.Context) error {
						select {
						case <-ctx.Done():
							after, cause = time.Since(begin), context.Cause(ctx)
						case <-time.After(20 * time.Second):
						}
						return nil
					}); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				begin = time.Now()
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				err := ex.Drain(ctx)
				if tc.want < 0 {
					if err != nil || after != -1 {
						t.Errorf("Drain = %v, the call cancelled after %v; want it never cancelled", err, after)
					}
					return
				}
				if err != nil || after != tc.want || !strings.Contains(cause.Error(), "cleanup window") {
					t.Errorf("Drain = %v, the call cancelled after %v (%v); want at %v for its window", err, after, cause, tc.want)
				}
			})
		})
	}
}

// A drain whose calls return before a cleanup window's cancel leaves no timer behind and
// cuts nothing.
func TestCleanupWindowNotDueWhenCallsReturn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: 8 * time.Second})
		core := internal.Of(ex)
		core.Settings().Owned, core.Settings().Grace = true, 10*time.Second
		core.Settings().Cleanups.Store("quick", 4*time.Second)
		var ended error
		if err := core.Go(context.Background(), internal.CallOptions{Name: "quick", Controller: "quick"},
			func(ctx context.Context) error {
				time.Sleep(2 * time.Second)
				ended = context.Cause(ctx)
				return nil
			}); err != nil {
			t.Fatal(err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		if ended != nil {
			t.Errorf("the call's context ended (%v) before it returned at 2s", ended)
		}
		for _, l := range lines.get() {
			if l.Msg == cancellingLine {
				t.Errorf("unexpected line %s", l.raw)
			}
		}
		if s := ex.Stats(); s.Cancelled != 0 {
			t.Errorf("Stats.Cancelled = %d, want 0", s.Cancelled)
		}
	})
}
