package internal

import (
	"context"
	"sync"
)

// MaxObserved bounds how many slow calls the Observers are told of per "Slow calls" line:
// the oldest MaxObserved of them, located (Where and Handler filled) from the line's own
// capture of the stacks. The line lists fewer (20) and counts the rest.
const MaxObserved = 100

// Observed is a call as an Observer sees it: the entry a log line shows, and the options
// the call was started with (Tag tells an observer which of its calls it is).
type Observed struct {
	Entry
	Options CallOptions
}

// Observer is told of calls that need a user's attention. reconcilers.WrapOptions.Recorder
// records Events on their objects from it.
type Observer interface {
	// Slow is called after each "Slow calls" line, on the goroutine that logged it, with
	// every slow call of that moment (daemons aside), oldest first, up to MaxObserved of
	// them: more than the line lists. Each is located as the line's are. It must not
	// block. ctx carries the executor's logger (logr.FromContextOrDiscard) and never ends.
	Slow(ctx context.Context, calls []Observed)
	// Abandoned is called by runnable.Runnable, once, with every call still running at the
	// end of the grace period (all of them, located: no bound), before its Start returns.
	// It must not block: the grace period is over. ctx carries the executor's logger.
	Abandoned(ctx context.Context, calls []Observed)
}

// Observers are the observers of one executor; the zero value has none. Safe for
// concurrent use.
type Observers struct {
	mu   sync.Mutex
	list []Observer
}

// Add adds o.
func (s *Observers) Add(o Observer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, o)
}

// List returns the observers added so far.
func (s *Observers) List() []Observer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list
}
