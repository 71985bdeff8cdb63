package claims

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ctrl          = "configmap"
	objNS         = "default"
	ns            = "operator-system"
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

func newRegistry(cs *fake.Clientset, clk *clocktesting.FakeClock, identity string) *Registry {
	return New(Options{Leases: cs.CoordinationV1().Leases(ns), Identity: identity,
		RenewDeadline: renewDeadline, RetryPeriod: retryPeriod, Clock: clk, Logger: logr.Discard()})
}

func getClaim(t *testing.T, cs *fake.Clientset, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("claim %s: %v", name, err)
	}
	return l
}

func TestName(t *testing.T) {
	names := map[string]bool{}
	for _, o := range [][3]string{
		{ctrl, objNS, "a"}, {ctrl, "other", "a"}, {"ConfigMap_Ctrl", objNS, "a"},
		{ctrl, objNS, strings.Repeat("Long.Name_", 30)}, {"", "", ""}, {"-x-", "", "--"},
	} {
		n := Name(o[0], o[1], o[2])
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("Name%q = %q: not a DNS-1123 subdomain: %v", o, n, errs)
		}
		if names[n] {
			t.Errorf("Name%q = %q: given to another object too", o, n)
		}
		names[n] = true
	}
	if got := Name(ctrl, objNS, "web"); !strings.HasPrefix(got, "claim-configmap-web-") {
		t.Errorf("Name = %q: want the readable prefix claim-configmap-web-", got)
	}
}

// A claim is taken with the holder and the duration, renewed every RetryPeriod while its
// work runs, and deleted when it ends.
func TestTakeRenewRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, "leader")
		c := r.Begin(ctrl, objNS, "web", "id1").(*Call)
		if got := r.InFlight(); len(got) != 1 || got[0] != c {
			t.Fatalf("InFlight = %v, want the call begun", got)
		}
		taken, err := r.Take(context.Background(), c, 15*time.Second+300*time.Millisecond)
		if err != nil || !taken {
			t.Fatalf("Take = %v, %v; want true, nil", taken, err)
		}
		name := Name(ctrl, objNS, "web")
		l := getClaim(t, cs, name)
		if h, d := ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseDurationSeconds, 0); h != "leader" || d != 16 {
			t.Errorf("claim holder %q, duration %ds; want leader, 16s (rounded up)", h, d)
		}
		if l.Labels[ControllerLabel] != ctrl || l.Annotations[ObjectAnnotation] != objNS+"/web" {
			t.Errorf("claim labels %v, annotations %v", l.Labels, l.Annotations)
		}
		first := l.Spec.RenewTime.Time
		synctest.Wait()
		clk.Step(retryPeriod)
		synctest.Wait()
		if got := getClaim(t, cs, name).Spec.RenewTime.Time; !got.Equal(first.Add(retryPeriod)) {
			t.Errorf("renewTime after one RetryPeriod = %v, want %v", got, first.Add(retryPeriod))
		}
		c.End()
		if _, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("claim after End: %v, want NotFound", err)
		}
		if got := r.InFlight(); len(got) != 0 {
			t.Errorf("InFlight after End = %v", got)
		}
		if taken, err := r.Take(context.Background(), c, time.Second); taken || err != nil {
			t.Errorf("Take after End = %v, %v; want false, nil", taken, err)
		}
	})
}

// Renewals that fail past RenewDeadline end the work's context at once, with a cause naming
// the claim; not before.
func TestFenceOnRenewalFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, "leader")
		c := r.Begin(ctrl, objNS, "web", "id1").(*Call)
		ctx, cancel := c.Bind(context.Background())
		defer cancel()
		if _, err := r.Take(context.Background(), c, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("connection refused")
		})
		for range 4 { // 8s: renewals fail, the deadline (10s) is not reached
			synctest.Wait()
			clk.Step(retryPeriod)
		}
		synctest.Wait()
		if ctx.Err() != nil {
			t.Fatalf("context ended %v after the last renewal, before RenewDeadline: %v", 4*retryPeriod, context.Cause(ctx))
		}
		clk.Step(renewDeadline - 4*retryPeriod)
		synctest.Wait()
		if ctx.Err() == nil {
			t.Fatal("context still live RenewDeadline after the last renewal")
		}
		if cause := context.Cause(ctx).Error(); !strings.Contains(cause, Name(ctrl, objNS, "web")) {
			t.Errorf("cause %q does not name the claim", cause)
		}
		// Bound after the fence: ended at once too.
		late, lateCancel := c.Bind(context.Background())
		defer lateCancel()
		if late.Err() == nil {
			t.Error("a context bound after the fence is live")
		}
		c.End()
	})
}

// A successful renewal moves the deadline: work renewed in time is never fenced.
func TestRenewalsKeepWorkAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, "leader")
		c := r.Begin(ctrl, objNS, "web", "id1").(*Call)
		ctx, cancel := c.Bind(context.Background())
		defer cancel()
		if _, err := r.Take(context.Background(), c, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		for range 3 * int(renewDeadline/retryPeriod) {
			synctest.Wait()
			clk.Step(retryPeriod)
		}
		synctest.Wait()
		if ctx.Err() != nil {
			t.Fatalf("renewed work fenced: %v", context.Cause(ctx))
		}
		c.End()
	})
}

// The successor judges a claim's expiry from when it first saw the holder's last write, on
// its own clock: a holder's renewTime in the past (another clock) does not expire it, and a
// renewal seen starts the duration again.
func TestWaitExpiryByOwnObservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, "successor")
		ctx := context.Background()
		name := Name(ctrl, objNS, "web")
		old := metav1.NewMicroTime(time.Unix(1, 0)) // the holder's clock, far behind
		l, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old-leader"), LeaseDurationSeconds: ptr.To[int32](10),
				RenewTime: &old, AcquireTime: &old},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wait := func(want time.Duration) {
			t.Helper()
			if got, err := r.Wait(ctx, ctrl, objNS, "web"); err != nil || got != want {
				t.Errorf("Wait = %v, %v; want %v", got, err, want)
			}
		}
		wait(10 * time.Second)
		clk.Step(4 * time.Second)
		wait(6 * time.Second)
		renewed := metav1.NewMicroTime(time.Unix(5, 0))
		l.Spec.RenewTime, l.ResourceVersion = &renewed, "2"
		if _, err := cs.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		wait(10 * time.Second) // a new write: the duration starts again
		if _, err := r.Take(ctx, r.Begin(ctrl, objNS, "web", "x").(*Call), time.Second); !errors.Is(err, ErrHeld) {
			t.Errorf("Take of a claim held unexpired = %v, want ErrHeld", err)
		}
		clk.Step(10 * time.Second)
		wait(0)
		// Another object, no claim; this replica's own claim.
		if got, err := r.Wait(ctx, ctrl, objNS, "other"); got != 0 || err != nil {
			t.Errorf("Wait without a claim = %v, %v", got, err)
		}
		mine := r.Begin(ctrl, objNS, "mine", "y").(*Call)
		if _, err := r.Take(ctx, mine, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if got, err := r.Wait(ctx, ctrl, objNS, "mine"); got != 0 || err != nil {
			t.Errorf("Wait on this replica's own claim = %v, %v", got, err)
		}
		mine.End()
		// An expired claim is taken over.
		c := r.Begin(ctrl, objNS, "web", "z").(*Call)
		if taken, err := r.Take(ctx, c, 20*time.Second); !taken || err != nil {
			t.Errorf("Take of an expired claim = %v, %v; want true, nil", taken, err)
		}
		if h := ptr.Deref(getClaim(t, cs, name).Spec.HolderIdentity, ""); h != "successor" {
			t.Errorf("holder after taking an expired claim: %q", h)
		}
		c.End()
	})
}

// Release gives a claim up while its reconcile still runs (a hand-over that did not happen);
// Stop stops renewing what is left without deleting it.
func TestReleaseAndStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, "leader")
		ctx := context.Background()
		a := r.Begin(ctrl, objNS, "a", "1").(*Call)
		b := r.Begin(ctrl, objNS, "b", "2").(*Call)
		for _, c := range []*Call{a, b} {
			if _, err := r.Take(ctx, c, 20*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		a.Release()
		if _, err := cs.CoordinationV1().Leases(ns).Get(ctx, Name(ctrl, objNS, "a"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("claim after Release: %v, want NotFound", err)
		}
		if len(r.InFlight()) != 2 {
			t.Errorf("a released claim's reconcile left InFlight")
		}
		r.Stop()
		before := getClaim(t, cs, Name(ctrl, objNS, "b")).Spec.RenewTime.Time
		clk.Step(3 * retryPeriod)
		synctest.Wait()
		if got := getClaim(t, cs, Name(ctrl, objNS, "b")).Spec.RenewTime.Time; !got.Equal(before) {
			t.Errorf("claim renewed after Stop: %v, was %v", got, before)
		}
		a.End()
		b.End()
	})
}
