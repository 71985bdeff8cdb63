package draintest

import (
	"errors"
	"fmt"

	"github.com/onsi/gomega/types"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// ExecutorOwner is what owns an executor, such as a *runnable.Runnable.
type ExecutorOwner interface {
	Executor() *drain.Executor
}

// HaveNoPendingCalls returns a Gomega matcher that succeeds when the actual
// *drain.Executor, or ExecutorOwner such as a *runnable.Runnable, has no tracked call
// pending. It fails listing each pending call like VerifyNone, and like it has no effect on
// the executor. Match only takes a snapshot, so the matcher can poll:
//
//	Eventually(q).Should(draintest.HaveNoPendingCalls())
func HaveNoPendingCalls() types.GomegaMatcher { return &noPendingMatcher{} }

type noPendingMatcher struct {
	ex   *drain.Executor
	last []drain.Pending // what the last Match found
}

func (m *noPendingMatcher) Match(actual any) (bool, error) {
	ex, err := executorOf(actual)
	if err != nil {
		return false, err
	}
	m.ex, m.last = ex, ex.Pending()
	return len(m.last) == 0, nil
}

func (m *noPendingMatcher) FailureMessage(any) string {
	if m.ex == nil {
		return "Expected no tracked call pending: Match was not called"
	}
	calls := m.last
	if located, _ := m.ex.Locate(-1); len(located) > 0 {
		calls = located
	}
	return "Expected no tracked call pending, found " + describe(calls, internal.Of(m.ex).Now())
}

func (m *noPendingMatcher) NegatedFailureMessage(any) string {
	return "Expected tracked calls pending, found none"
}

func executorOf(actual any) (ex *drain.Executor, err error) {
	switch a := actual.(type) {
	case *drain.Executor:
		ex = a
	case ExecutorOwner:
		defer func() { // a nil pointer whose Executor method dereferences it
			if v := recover(); v != nil {
				ex, err = nil, fmt.Errorf("HaveNoPendingCalls failed to get the executor of %T: %v", actual, v)
			}
		}()
		ex = a.Executor()
	default:
		return nil, fmt.Errorf("HaveNoPendingCalls expects a *drain.Executor or an ExecutorOwner, got %T", actual)
	}
	if ex == nil {
		return nil, errors.New("HaveNoPendingCalls got a nil executor")
	}
	return ex, nil
}
