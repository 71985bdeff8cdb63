package shutdowntest

import (
	"errors"
	"fmt"

	"github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
)

// HaveExitedGracefully succeeds for a Result (or *Result) whose operator exited with code 0
// by itself and abandoned no call: every call returned within the grace period (a main that
// ignores the Runnable's Err exits 0 even so: this matcher does not), and the harness neither
// signalled twice nor killed it. It fails with Stop's error when the harness could read none of
// the operator's log lines (see Stop), as it cannot tell then. Its failure message has the
// exit code, the time taken, the
// abandoned calls and the log's last lines. Like every matcher here, it fails (never panics)
// on a nil *Result, e.g. Stop's after a failure.
func HaveExitedGracefully() types.GomegaMatcher { return gracefulMatcher{} }

type gracefulMatcher struct{}

func (gracefulMatcher) Match(actual any) (bool, error) {
	res, err := asResult(actual)
	if err != nil {
		return false, err
	}
	if res.ExitCode != 0 || res.Killed {
		return false, nil
	}
	if res.logErr != nil { // whether calls were abandoned is in a log it cannot read
		return false, res.logErr
	}
	return res.AbandonedCount == 0 && len(res.Abandoned) == 0, nil
}

func (gracefulMatcher) FailureMessage(actual any) string {
	res, _ := asResult(actual) // Match checked it
	how := fmt.Sprintf("exited with code %d", res.ExitCode)
	if res.Killed {
		how += " after the harness had to stop it (a second SIGTERM or SIGKILL)"
	}
	if res.AbandonedCount > 0 {
		how += fmt.Sprintf(", abandoning %d call(s): %v", res.AbandonedCount, res.Abandoned)
	}
	return fmt.Sprintf("Expected the operator to exit with code 0 by itself; it %s, %s after SIGTERM. "+
		"Its log:\n%s", how, res.Took, logExcerpt(res.Lines))
}

func (gracefulMatcher) NegatedFailureMessage(actual any) string {
	res, _ := asResult(actual) // Match checked it
	return fmt.Sprintf("Expected the operator not to exit gracefully; it exited with code 0, %s after SIGTERM",
		res.Took)
}

func asResult(actual any) (*Result, error) {
	switch r := actual.(type) {
	case *Result:
		if r == nil {
			return nil, errors.New("shutdowntest matchers expect a Result, got a nil *shutdowntest.Result " +
				"(did Stop fail? check its error first)")
		}
		return r, nil
	case Result:
		return &r, nil
	}
	return nil, fmt.Errorf("shutdowntest matchers expect a shutdowntest.Result or *shutdowntest.Result, got %T", actual)
}

// HaveAbandoned succeeds for a Result (or *Result) whose Abandoned lists a call that name matches: a
// string (the exact call name, e.g. "memcached/default/a/legacy-export") or a Gomega matcher
// (e.g. ContainSubstring("legacy-export")).
func HaveAbandoned(name any) types.GomegaMatcher {
	return gomega.WithTransform(resultField(func(r *Result) []string { return r.Abandoned }), gomega.ContainElement(name))
}

// HaveLogged succeeds for a Result (or *Result) with a line in its log that text matches: a string
// (contained in the line) or a Gomega matcher of a string.
func HaveLogged(text any) types.GomegaMatcher {
	m, ok := text.(types.GomegaMatcher)
	if !ok {
		m = gomega.ContainSubstring(fmt.Sprint(text))
	}
	return gomega.WithTransform(resultField(func(r *Result) []string { return r.Lines }), gomega.ContainElement(m))
}

// resultField returns a Gomega transform that reads field of a Result or *Result, and fails
// on anything else.
func resultField(field func(*Result) []string) func(any) ([]string, error) {
	return func(actual any) ([]string, error) {
		r, err := asResult(actual)
		if err != nil {
			return nil, err
		}
		return field(r), nil
	}
}
