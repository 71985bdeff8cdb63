package drain_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// TestDaemon: a call started with CallOptions.Daemon is listed as one, is never slow, and
// its context ends as the drain begins, while CancelAfter keeps the others running.
func TestDaemon(t *testing.T) {
	const daemonName = "daemons/ns/obj/watch"
	synctest.Test(t, func(t *testing.T) {
		lines := &logs{}
		ex := drain.New(drain.Options{Logger: lines.logger(t), SlowAfter: time.Second, CancelAfter: -1})
		stopped := make(chan error, 1)
		err := internal.Of(ex).Go(context.Background(), internal.CallOptions{Name: daemonName, Daemon: true},
			func(ctx context.Context) error {
				<-ctx.Done()
				stopped <- context.Cause(ctx)
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		if err := ex.Go(context.Background(), "worker", func(context.Context) error { <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if p := ex.Pending(); len(p) != 2 || !p[0].Daemon || p[0].Name != daemonName || p[1].Daemon {
			t.Errorf("Pending = %+v, want the daemon listed as one", p)
		}
		if s := ex.Stats(); s.Slow != 1 || s.Oldest != ex.Pending()[1].Started {
			t.Errorf("Stats = %+v, want the worker alone slow and oldest", s)
		}
		for _, l := range lines.get() {
			for _, c := range l.Calls {
				if c.Name == daemonName {
					t.Errorf("the daemon was logged: %s", l.raw)
				}
			}
		}

		drained := make(chan error, 1)
		go func() { drained <- ex.Drain(context.Background()) }()
		if err := <-stopped; err == nil || err.Error() != "cancelled by the drain" {
			t.Errorf("daemon's context ended with cause %v, want the drain's", err)
		}
		err = internal.Of(ex).Go(context.Background(), internal.CallOptions{Name: "late", Daemon: true},
			func(context.Context) error { return nil })
		if !errors.Is(err, drain.ErrDraining) {
			t.Errorf("Go once draining = %v, want ErrDraining", err)
		}
		close(release)
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
	})
}
