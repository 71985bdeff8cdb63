package drain

import "github.com/quiesce-dev/quiesce/internal"

// mustBeCreated panics unless e was created by New. Every exported method of Executor
// calls it first: a zero Executor (var e drain.Executor, or &drain.Executor{}) has no
// channels, clock nor core, and would otherwise fail later with a nil dereference far
// from the mistake. The check is one load and compare: New always makes draining.
func (e *Executor) mustBeCreated() {
	if e == nil || e.draining == nil {
		panic(internal.NotCreated)
	}
}
