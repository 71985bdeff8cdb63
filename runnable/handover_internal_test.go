package runnable

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/quiesce-dev/quiesce/internal/claims"
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

// A release of the lease that fails hands nothing over, and keeps the claims taken until
// their work returns: a write that failed may still have landed, and a successor then honours
// them. A claim that cannot be taken, by contrast, releases those taken.
func TestHandOverKeepsClaimsWhenTheReleaseFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := newLeased(t, Options{GracePeriod: 20 * time.Second}, 3*time.Second)
		cs := fake.NewClientset()
		leases := cs.CoordinationV1().Leases("ns")
		x.r.claims = claims.New(claims.Options{Leases: leases, Identity: "me", RenewDeadline: 3 * time.Second,
			RetryPeriod: time.Second, Clock: x.r.clock, Logger: logr.Discard()})
		release := make(chan struct{})
		x.call(t, release)
		c := x.r.claims.Begin("ctl", "ns", "x", "")
		if err := x.renew(); err != nil {
			t.Fatal(err)
		}
		x.lock.failWrites()
		ctx, stop := context.WithCancel(context.Background())
		stop()
		started := make(chan error, 1)
		go func() { started <- x.r.Start(ctx) }()
		synctest.Wait()
		if !slices.Contains(x.logs.messages(), "Not handing the lease over") {
			t.Errorf("log = %q, want the failed hand-over", x.logs.messages())
		}
		name := claims.Name("ctl", "ns", "x")
		if _, err := leases.Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			t.Errorf("the claim while its work runs, the release failed: %v, want it kept", err)
		}
		c.End()
		close(release)
		if err := <-started; err != nil {
			t.Fatal(err)
		}
		if _, err := leases.Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the claim once its work returned: %v, want NotFound", err)
		}
	})
}
