package drain_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// observer records what an executor tells its Observers.
type observer struct {
	mu              sync.Mutex
	slow, abandoned [][]internal.Observed
}

func (o *observer) Slow(_ context.Context, calls []internal.Observed) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.slow = append(o.slow, calls)
}

func (o *observer) Abandoned(_ context.Context, calls []internal.Observed) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.abandoned = append(o.abandoned, calls)
}

func (o *observer) get() (slow, abandoned [][]internal.Observed) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([][]internal.Observed(nil), o.slow...), append([][]internal.Observed(nil), o.abandoned...)
}

// checkObserved fails unless calls are the calls named "call-0".. oldest first, each
// located at where, each with its Tag.
func checkObserved(t *testing.T, calls []internal.Observed, want int, where string) {
	t.Helper()
	if len(calls) != want {
		t.Fatalf("observed %d calls, want %d", len(calls), want)
	}
	for i, c := range calls {
		if name := fmt.Sprint("call-", i); c.Name != name || c.Options.Name != name || c.Options.Tag != i ||
			c.Where != where || c.Handler != where {
			t.Fatalf("observed call %d = %+v, want %s located at %s, tagged %d", i, c, name, where, i)
		}
	}
}

// The observers hear of every slow call, up to internal.MaxObserved per line, located,
// while the line lists 20 and counts the rest; at the end of the grace period they hear of
// every call, unbounded.
func TestObserversHearOfMoreSlowCallsThanTheLineLists(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), SlowAfter: 10 * time.Second, ReportEvery: 5 * time.Second})
		obs := &observer{}
		core := internal.Of(ex)
		core.Settings().Observers.Add(obs)
		const n = internal.MaxObserved + 5
		started := make(chan string, n)
		release := make(chan struct{})
		for i := range n {
			o := internal.CallOptions{Name: fmt.Sprint("call-", i), Tag: i}
			if err := core.Go(context.Background(), o, blocking(started, release)); err != nil {
				t.Fatal(err)
			}
		}
		var where string
		for range n {
			where = <-started // the same line for all
		}
		// A daemon is never slow.
		if err := core.Go(context.Background(), internal.CallOptions{Name: "daemon", Daemon: true},
			func(ctx context.Context) error { <-ctx.Done(); return nil }); err != nil {
			t.Fatal(err)
		}

		time.Sleep(10 * time.Second)
		synctest.Wait()
		got := lines.get()
		if len(got) != 1 || got[0].Slow != n || len(got[0].Calls) != 20 || got[0].More != n-20 {
			t.Fatalf("log lines = %+v, want one Slow calls line listing 20 of %d", got, n)
		}
		slow, _ := obs.get()
		if len(slow) != 1 {
			t.Fatalf("observers told %d times, want once", len(slow))
		}
		checkObserved(t, slow[0], internal.MaxObserved, where)

		core.Abandoned(context.Background())
		_, abandoned := obs.get()
		if len(abandoned) != 1 {
			t.Fatalf("observers told of abandoned calls %d times, want once", len(abandoned))
		}
		if last := abandoned[0][n]; len(abandoned[0]) != n+1 || last.Name != "daemon" {
			t.Fatalf("abandoned: %d calls, the last %+v; want all %d and the daemon", len(abandoned[0]), last, n)
		}
		checkObserved(t, abandoned[0][:n], n, where)

		close(release)
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}
