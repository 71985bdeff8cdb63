package drain

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/quiesce-dev/quiesce/internal"
)

// observed pairs the located calls with their entries, for internal.Observer.
func observed(calls []*call, ents []internal.Entry) []internal.Observed {
	out := make([]internal.Observed, len(calls))
	for i, c := range calls {
		out[i] = internal.Observed{Entry: ents[i], Options: c.Options()}
	}
	return out
}

// observeTimeout bounds the observers (Events read objects) per "Slow calls" line.
const observeTimeout = 5 * time.Second

// observeSlow tells the observers of a line's slow calls (up to internal.MaxObserved).
func (e *Executor) observeSlow(obs []internal.Observer, calls []*call, ents []internal.Entry) {
	if len(obs) == 0 {
		return
	}
	o := observed(calls, ents)
	ctx, cancel := context.WithTimeout(logr.NewContext(context.Background(), e.log), observeTimeout)
	defer cancel()
	for _, ob := range obs {
		e.safely(func() { ob.Slow(ctx, o) })
	}
}

func (c *core) Abandoned(ctx context.Context) {
	e := (*Executor)(c)
	obs := e.settings.Observers.List()
	if len(obs) == 0 {
		return
	}
	ctx = logr.NewContext(ctx, e.log)
	calls, _ := e.list(-1)
	o := observed(calls, entries(e.locate(calls), e.clock.Now()))
	var wg sync.WaitGroup
	for _, ob := range obs {
		wg.Go(func() { e.safely(func() { ob.Abandoned(ctx, o) }) })
	}
	wg.Wait()
}
