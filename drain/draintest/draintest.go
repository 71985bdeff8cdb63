package draintest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/quiesce-dev/quiesce/drain"
)

// TestingT is the subset of testing.TB that VerifyNone uses.
type TestingT interface {
	Helper()
	Errorf(format string, args ...any)
}

var _ TestingT = testing.TB(nil)

// Option configures VerifyNone and HaveNoPendingCalls.
type Option func(*options)

type options struct {
	clock clock.PassiveClock
}

// WithClock sets the clock that ages are measured on. Pass the executor's drain.Options
// Clock when it is a fake one, since calls are stamped with it. Default: the real clock.
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

func newOptions(opts []Option) options {
	o := options{clock: clock.RealClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// VerifyNone marks t failed, with Errorf, if ex has a tracked call still pending, listing
// each with its name, age, whether it is detached, and where its goroutine is blocked. It
// does not wait: call it once the calls should have returned, typically after the test
// stopped the manager whose runnable drains ex. To wait for them, use HaveNoPendingCalls
// with Gomega's Eventually, or ex.Drain with a deadline.
//
// VerifyNone never starts a drain. The locations come from drain.Executor.Drain, the only
// way to have the executor capture stacks, and a drain refuses every later call and may
// cancel the running ones: a side effect that a verification must not have on an executor
// still in use, when the test goes on after a failure. So VerifyNone lists locations only
// when ex drains already (it then calls Drain with a cancelled context, which returns at
// once); otherwise the listing says where to look without them. Drain counts the calls it
// finds as abandoned in ex.Stats, as the runnable's own Drain already did when it gave up.
func VerifyNone(t TestingT, ex *drain.Executor, opts ...Option) {
	t.Helper()
	if ex == nil {
		t.Errorf("draintest: nil executor")
		return
	}
	o := newOptions(opts)
	calls := locate(ex, ex.Pending())
	if len(calls) == 0 {
		return
	}
	t.Errorf("%s", describe(calls, draining(ex), o.clock.Now()))
}

// locate returns the calls of snapshot with Where filled in when ex drains, dropping those
// that returned since. When ex does not drain, it returns snapshot unchanged.
func locate(ex *drain.Executor, snapshot []drain.Pending) []drain.Pending {
	if len(snapshot) == 0 {
		return nil
	}
	select {
	case <-ex.Draining():
	default:
		return snapshot
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var pe *drain.PendingError
	if err := ex.Drain(ctx); !errors.As(err, &pe) {
		return nil // every call returned meanwhile
	}
	where := make(map[callKey]string, len(pe.Pending))
	for _, p := range pe.Pending {
		where[callKey{p.Name, p.Started}] = p.Where
	}
	out := make([]drain.Pending, 0, len(snapshot))
	for _, p := range snapshot {
		w, ok := where[callKey{p.Name, p.Started}]
		if !ok {
			continue // returned since the snapshot
		}
		p.Where = w
		out = append(out, p)
	}
	return out
}

func draining(ex *drain.Executor) bool {
	select {
	case <-ex.Draining():
		return true
	default:
		return false
	}
}

type callKey struct {
	name    string
	started time.Time
}

// describe lists calls, one per line. drained says whether their locations were asked for.
func describe(calls []drain.Pending, drained bool, now time.Time) string {
	var b strings.Builder
	if len(calls) == 1 {
		b.WriteString("1 tracked call still pending:")
	} else {
		fmt.Fprintf(&b, "%d tracked calls still pending:", len(calls))
	}
	unknown := false
	for _, p := range calls {
		fmt.Fprintf(&b, "\n\t%s: age %s", p.Name, age(now.Sub(p.Started)))
		if p.Detached {
			b.WriteString(", detached")
		}
		switch {
		case p.Where != "":
			b.WriteString(", at " + p.Where)
		case drained: // the goroutine's stack was too deep to find the call's frame
			b.WriteString(", at an unknown location")
		default:
			unknown = true
		}
	}
	if unknown {
		b.WriteString("\n(where a call blocks is known once its executor drains: " +
			"verify after stopping the manager, or after Drain)")
	}
	return b.String()
}

// age rounds d for reading, as the executor's reports do: whole seconds from 1s on,
// milliseconds below.
func age(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}
