package drain

import (
	"fmt"

	"github.com/quiesce-dev/quiesce/internal"
)

// mustBeCreated panics unless e was created by New, and created returns an error wrapping
// ErrInvalidCall instead: the setup misuse of an Executor that New did not make (var e
// drain.Executor, &drain.Executor{}, a nil one) is reported by the methods that return an
// error (Call, Go, Run, Drain) as that error, and by the others (Pending, Locate, Draining,
// Stats) as a panic, the package's rule for misuse. Such an executor has no channels, clock
// nor core, and would otherwise fail later with a nil dereference far from the mistake. The
// check is one load and compare: New always makes draining.
func (e *Executor) mustBeCreated() {
	if e == nil || e.draining == nil {
		panic(internal.NotCreated)
	}
}

func (e *Executor) created() error {
	if e == nil || e.draining == nil {
		return errNotCreated
	}
	return nil
}

var errNotCreated = fmt.Errorf("%s: %w", internal.NotCreated, ErrInvalidCall)
