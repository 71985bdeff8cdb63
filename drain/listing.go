package drain

import "github.com/quiesce-dev/quiesce/internal"

// Listing implements internal.Core.Listing: list copies the call pointers under e.mu (for
// a bounded limit, that many), and the names, ages and locations are rendered outside it, so
// that a listing holds up admission no longer than copying its calls takes.
func (c *core) Listing(limit int) (internal.Entries, int) {
	e := (*Executor)(c)
	calls, total := e.list(limit)
	return entries(e.locateWith(calls, true), c.clock.Now()), total
}
