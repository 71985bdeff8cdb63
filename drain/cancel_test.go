package drain_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
)

// When the drain cancels calls at CancelAfter, one line names how many and which (bounded
// like the reports, the rest counted), after the reports and before the drain returns, and
// Stats.Cancelled counts them; daemons, cancelled as the drain begins, are not counted.
func TestCancellingCallsLineAndCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{
			Logger: lines.logger(t), ReportAfter: time.Second, ReportEvery: time.Second, CancelAfter: 2500 * time.Millisecond,
		})
		const n = 25
		for i := range n {
			mustGo(t, ex, fmt.Sprintf("call-%02d", i), func(ctx context.Context) error {
				<-ctx.Done()
				return nil
			})
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := lines.get()
		msgs := make([]string, 0, len(got))
		for _, l := range got {
			msgs = append(msgs, l.Msg)
		}
		const waiting, cancelling = "Waiting for pending calls", "Cancelling calls still running"
		want := []string{waiting, waiting, cancelling}
		if fmt.Sprint(msgs) != fmt.Sprint(want) {
			t.Fatalf("lines %q, want %q", msgs, want)
		}
		c := got[2]
		if c.Cancelled != n || len(c.Calls) != 20 || c.More != n-20 || c.Calls[0].Name != "call-00" || !strings.HasPrefix(c.Cause, "cancelled by the drain") {
			t.Errorf("cancel line = %s, want %d cancelled, 20 listed from call-00, %d more, the drain's cause", c.raw, n, n-20)
		}
		if s := ex.Stats(); s.Cancelled != n {
			t.Errorf("Stats.Cancelled = %d, want %d", s.Cancelled, n)
		}
	})
}

// A drain whose calls all return before CancelAfter cancels none: no line, nothing counted.
func TestNoCancellingLineWhenCallsReturnInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), CancelAfter: 3 * time.Second})
		mustGo(t, ex, "quick", func(context.Context) error {
			time.Sleep(2 * time.Second)
			return nil
		})
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, l := range lines.get() {
			if l.Msg == "Cancelling calls still running" {
				t.Errorf("unexpected line %s", l.raw)
			}
		}
		if s := ex.Stats(); s.Cancelled != 0 {
			t.Errorf("Stats.Cancelled = %d, want 0", s.Cancelled)
		}
	})
}
