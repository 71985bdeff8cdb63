package runnable

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// Once handed over, the lease shows no holder and a 1s duration, as client-go's release
// writes it; the elector's renewals and its release (LeaderElectionReleaseOnCancel) are
// swallowed, so the successor's lease is never written; its reads answer the record it wrote
// last, so it never gives up; and no fence follows, however long the claimed work runs.
func TestHandOverSwallowsTheElectorsWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{GracePeriod: 20 * time.Second}, 3*time.Second)
		release := make(chan struct{})
		ended := x.call(t, release)
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		if err := x.l.handOver(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec, _, _ := x.lock.Get(context.Background())
		if rec.HolderIdentity != "" || rec.LeaseDurationSeconds != 1 {
			t.Fatalf("lease after the hand-over = %+v, want no holder and 1s", rec)
		}
		x.lock.set("successor")
		writes := x.lock.writesSeen()
		for range 10 {
			time.Sleep(2 * time.Second)
			if err := x.renew(); err != nil {
				t.Fatalf("a renewal after the hand-over = %v, want nil (swallowed)", err)
			}
			got, raw, err := x.l.Get(context.Background())
			if err != nil || got.HolderIdentity != "me" || len(raw) == 0 {
				t.Fatalf("Get after the hand-over = %+v, %q, %v; want this replica's last record", got, raw, err)
			}
		}
		if err := x.l.Update(context.Background(), heldBy("")); err != nil { // ReleaseOnCancel's release
			t.Fatalf("the elector's release after the hand-over = %v, want nil (swallowed)", err)
		}
		if n := x.lock.writesSeen(); n != writes {
			t.Errorf("the lease was written %d times after the hand-over", n-writes)
		}
		if rec, _, _ := x.lock.Get(context.Background()); rec.HolderIdentity != "successor" {
			t.Errorf("the successor's lease was blanked: %+v", rec)
		}
		select {
		case err := <-ended:
			t.Fatalf("the call ended with %v after the hand-over: fenced by the lease", err)
		default:
		}
		if m := x.logs.messages(); len(m) != 0 {
			t.Errorf("log = %q, want nothing", m)
		}
		close(release)
		ctx, stop := context.WithCancel(context.Background())
		stop()
		if err := x.r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A replica that does not hold the lease, or cannot write it, hands nothing over and its
// elector's writes go through as before.
func TestHandOverNeedsTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{}, 3*time.Second)
		if err := x.l.handOver(context.Background()); !errors.Is(err, errNotHeld) {
			t.Errorf("handOver without the lease = %v, want %v", err, errNotHeld)
		}
		if n := x.lock.writesSeen(); n != 0 {
			t.Errorf("handOver without the lease wrote %d times", n)
		}
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		x.lock.failWrites()
		if err := x.l.handOver(context.Background()); err == nil {
			t.Error("handOver with the lease unwritable = nil")
		}
		if err := x.renew(); err == nil {
			t.Error("a renewal after a failed hand-over was swallowed")
		}
		ctx, stop := context.WithCancel(context.Background())
		stop()
		_ = x.r.Start(ctx)
	})
}
