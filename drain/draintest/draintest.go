package draintest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// TestingT is the subset of testing.TB that VerifyNone uses.
type TestingT interface {
	Helper()
	Errorf(format string, args ...any)
}

var _ TestingT = testing.TB(nil)

// VerifyNone marks t failed, with Errorf, if ex has a tracked call still pending, listing
// each with its name, age, whether it is detached, where its goroutine is blocked and the
// line of its own function where it waits (see drain.Executor.Locate). Ages are measured
// on the executor's clock (drain.Options.Clock). A call counts from
// the moment Call, Go or Run admitted it. VerifyNone does not wait: call it once the calls
// should have returned, typically after the test stopped the manager whose runnable drains
// ex. To wait for them, use HaveNoPendingCalls with Gomega's Eventually, or ex.Drain with a
// deadline. It has no effect on ex: it neither drains it nor counts anything.
func VerifyNone(t TestingT, ex *drain.Executor) {
	t.Helper()
	if ex == nil {
		t.Errorf("draintest: nil executor")
		return
	}
	if len(ex.Pending()) == 0 {
		return
	}
	calls, _ := ex.Locate(-1)
	if len(calls) == 0 {
		return // they returned meanwhile
	}
	t.Errorf("%s", describe(calls, internal.Of(ex).Now()))
}

// describe lists calls, one per line.
func describe(calls []drain.Pending, now time.Time) string {
	var b strings.Builder
	if len(calls) == 1 {
		b.WriteString("1 tracked call still pending:")
	} else {
		fmt.Fprintf(&b, "%d tracked calls still pending:", len(calls))
	}
	unknown := false
	for _, p := range calls {
		fmt.Fprintf(&b, "\n\t%q: age %s", internal.Cut(p.Name), internal.Age(now.Sub(p.Started)))
		if p.Detached {
			b.WriteString(", detached")
		}
		switch p.Where {
		case "":
		case drain.NotStarted:
			b.WriteString(", not started yet")
		case drain.Unknown:
			b.WriteString(", at an unknown location")
			unknown = true
		default:
			b.WriteString(", at " + internal.Cut(p.Where))
			if p.Handler != "" && p.Handler != p.Where {
				b.WriteString(", in " + internal.Cut(p.Handler))
			}
		}
	}
	if unknown {
		b.WriteString("\n(the executor logs once why a location is unknown)")
	}
	return b.String()
}
