package claims

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

	"github.com/quiesce-dev/quiesce/internal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	ctrl          = "configmap"
	objNS         = "default"
	ns            = "operator-system"
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
	leaderID      = "leader"
)

func newRegistry(cs *fake.Clientset, clk *clocktesting.FakeClock, identity string) *Registry {
	r, _ := newCounted(cs, clk, identity)
	return r
}

// counts are what the On hooks were told, by hook and controller.
type counts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counts) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// newCounted is newRegistry with its On hooks counted under "waited/<controller>",
// "renewFailed/..." and "fenced/...".
func newCounted(cs *fake.Clientset, clk *clocktesting.FakeClock, identity string) (*Registry, *counts) {
	c := &counts{n: map[string]int{}}
	hook := func(kind string) func(string) {
		return func(controller string) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.n[kind+"/"+controller]++
		}
	}
	return New(Options{Leases: cs.CoordinationV1().Leases(ns), Identity: identity,
		RenewDeadline: renewDeadline, RetryPeriod: retryPeriod, Clock: clk, Logger: logr.Discard(),
		OnWaited: hook("waited"), OnRenewFailed: hook("renewFailed"), OnFenced: hook("fenced")}), c
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
		r := newRegistry(cs, clk, leaderID)
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
		if h, d := ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseDurationSeconds, 0); h != leaderID || d != 16 {
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
// the claim, and call Bind's onFence once; not before. Failures and the fence are counted.
func TestFenceOnRenewalFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r, n := newCounted(cs, clk, leaderID)
		c := r.Begin(ctrl, objNS, "web", "id1").(*Call)
		var notified atomic.Int32
		ctx, cancel := c.Bind(context.Background(), func() { notified.Add(1) })
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
		if got := n.get("renewFailed/" + ctrl); got != 4 {
			t.Errorf("renewals failed counted: %d, want 4", got)
		}
		if got, f := notified.Load(), n.get("fenced/"+ctrl); got != 0 || f != 0 {
			t.Errorf("before the deadline: onFence called %d times, fences counted %d; want 0", got, f)
		}
		clk.Step(renewDeadline - 4*retryPeriod)
		synctest.Wait()
		if ctx.Err() == nil {
			t.Fatal("context still live RenewDeadline after the last renewal")
		}
		if got, f := notified.Load(), n.get("fenced/"+ctrl); got != 1 || f != 1 {
			t.Errorf("fenced: onFence called %d times, fences counted %d; want 1", got, f)
		}
		if cause := context.Cause(ctx).Error(); !strings.Contains(cause, Name(ctrl, objNS, "web")) {
			t.Errorf("cause %q does not name the claim", cause)
		}
		// Bound after the fence: ended at once too.
		late, lateCancel := c.Bind(context.Background(), nil)
		defer lateCancel()
		if late.Err() == nil {
			t.Error("a context bound after the fence is live")
		}
		c.End()
	})
}

// A renewal stuck past the deadline: the fence ends the work, whose End stops the renewals
// while the renewal is still stuck; when it returns, the fence is still reported (its line,
// OnFenced, onFence), however the renewing goroutine's select picks. 20 times: a random pick
// that missed it would fail at least once in a million runs.
func TestFenceReportedWhenTheWorkEndsFirst(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			cs := fake.NewClientset()
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			r, n := newCounted(cs, clk, leaderID)
			c := r.Begin(ctrl, objNS, "web", "id1").(*Call)
			var notified atomic.Int32
			ctx, cancel := c.Bind(context.Background(), func() { notified.Add(1) })
			defer cancel()
			if _, err := r.Take(context.Background(), c, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			unblock := make(chan struct{})
			cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				<-unblock
				return true, nil, errors.New("timeout")
			})
			synctest.Wait()
			clk.Step(retryPeriod) // the renewal, stuck
			synctest.Wait()
			clk.Step(renewDeadline) // the fence
			synctest.Wait()
			if ctx.Err() == nil {
				t.Fatal("context live past the deadline")
			}
			ended := make(chan struct{})
			go func() { c.End(); close(ended) }() // the work returns: End waits for the renewals to stop
			synctest.Wait()
			close(unblock)
			<-ended
			if got, f := notified.Load(), n.get("fenced/"+ctrl); got != 1 || f != 1 {
				t.Errorf("onFence called %d times, fences counted %d; want 1", got, f)
			}
		})
	}
}

// A successful renewal moves the deadline: work renewed in time is never fenced.
func TestRenewalsKeepWorkAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, leaderID)
		c := r.Begin(ctrl, objNS, "web", "id1").(*Call)
		ctx, cancel := c.Bind(context.Background(), func() { t.Error("onFence called for renewed work") })
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
// renewal seen starts the duration again. First is true once per holder; a claim found held
// is counted.
func TestWaitExpiryByOwnObservation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r, n := newCounted(cs, clk, "successor")
		ctx := context.Background()
		name := Name(ctrl, objNS, "web")
		old := metav1.NewMicroTime(time.Unix(1, 0)) // the holder's clock, far behind
		l, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Labels: map[string]string{ControllerLabel: ctrl}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("old-leader"), LeaseDurationSeconds: ptr.To[int32](10),
				RenewTime: &old, AcquireTime: &old},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wait := func(want time.Duration, first bool) {
			t.Helper()
			w := internal.ClaimWait{Left: want, First: first}
			if want > 0 {
				w.Holder = "old-leader"
			}
			if got, err := r.Wait(ctx, ctrl, objNS, "web"); err != nil || got != w {
				t.Errorf("Wait = %+v, %v; want %+v", got, err, w)
			}
		}
		wait(10*time.Second, true)
		clk.Step(4 * time.Second)
		wait(6*time.Second, false)
		renewed := metav1.NewMicroTime(time.Unix(5, 0))
		l.Spec.RenewTime, l.ResourceVersion = &renewed, "2"
		if _, err := cs.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		wait(10*time.Second, false) // a new write: the duration starts again; the same holder
		if _, err := r.Take(ctx, r.Begin(ctrl, objNS, "web", "x").(*Call), time.Second); !errors.Is(err, ErrHeld) {
			t.Errorf("Take of a claim held unexpired = %v, want ErrHeld", err)
		}
		clk.Step(10 * time.Second)
		// Expired by this replica's observation: an expired claim is taken over.
		c := r.Begin(ctrl, objNS, "web", "z").(*Call)
		if taken, err := r.Take(ctx, c, 20*time.Second); !taken || err != nil {
			t.Errorf("Take of an expired claim = %v, %v; want true, nil", taken, err)
		}
		if h := ptr.Deref(getClaim(t, cs, name).Spec.HolderIdentity, ""); h != "successor" {
			t.Errorf("holder after taking an expired claim: %q", h)
		}
		wait(0, false) // this replica's own claim now
		c.End()
		if got := n.get("waited/" + ctrl); got != 3 {
			t.Errorf("waits counted: %d, want 3 (the claim found held)", got)
		}
		// Another object, no claim; this replica's own claim.
		if got, err := r.Wait(ctx, ctrl, objNS, "other"); got.Left != 0 || err != nil {
			t.Errorf("Wait without a claim = %v, %v", got, err)
		}
		mine := r.Begin(ctrl, objNS, "mine", "y").(*Call)
		if _, err := r.Take(ctx, mine, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if got, err := r.Wait(ctx, ctrl, objNS, "mine"); got.Left != 0 || err != nil {
			t.Errorf("Wait on this replica's own claim = %v, %v", got, err)
		}
		mine.End()
	})
}

// requests returns the verbs of the requests cs received on leases since the last call.
func requests(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "leases" {
			out = append(out, a.GetVerb())
		}
	}
	cs.ClearActions()
	return out
}

// takeA has leader take a claim on objNS/a, written with resourceVersion "7" (the fake
// clientset writes none).
func takeA(t *testing.T, cs *fake.Clientset, leader *Registry) *Call {
	t.Helper()
	a := leader.Begin(ctrl, objNS, "a", "1").(*Call)
	if _, err := leader.Take(context.Background(), a, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	l := getClaim(t, cs, Name(ctrl, objNS, "a"))
	l.ResourceVersion = "7"
	if err := cs.Tracker().Update(coordinationv1.SchemeGroupVersion.WithResource("leases"), l, ns); err != nil {
		t.Fatal(err)
	}
	return a
}

// Wait lists the claims once (again after a failed list), then reads again only the claims
// of other replicas it found: any other object costs no request.
func TestWaitListsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		ctx := context.Background()
		a := takeA(t, cs, newRegistry(cs, clk, leaderID))
		defer a.End()
		now := metav1.NewMicroTime(clk.Now())
		if _, err := cs.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ // no label: not a claim
			ObjectMeta: metav1.ObjectMeta{Name: Name(ctrl, objNS, "u")},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other"), LeaseDurationSeconds: ptr.To[int32](60), RenewTime: &now},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		failList := atomic.Bool{}
		failList.Store(true)
		cs.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if failList.Swap(false) {
				return true, nil, apierrors.NewServiceUnavailable("slow down")
			}
			return false, nil, nil
		})
		succ := newRegistry(cs, clk, "successor")
		if _, err := succ.Wait(ctx, ctrl, objNS, "b"); err == nil || !strings.Contains(err.Error(), "failed to list claims") {
			t.Errorf("Wait with the list failing = %v, want its error", err)
		}
		requests(cs)
		for _, o := range []string{"b", "b", "u"} {
			if w, err := succ.Wait(ctx, ctrl, objNS, o); err != nil || w != (internal.ClaimWait{}) {
				t.Errorf("Wait(%s) of an object not claimed = %+v, %v", o, w, err)
			}
		}
		if got := requests(cs); !slices.Equal(got, []string{"list"}) {
			t.Errorf("requests of three Waits of objects not claimed: %v, want one list", got)
		}
		if w, err := succ.Wait(ctx, ctrl, objNS, "a"); err != nil || w.Left != 20*time.Second || w.Holder != leaderID {
			t.Errorf("Wait(a) = %+v, %v; want held 20s by %s", w, err, leaderID)
		}
		if got := requests(cs); !slices.Equal(got, []string{"get"}) {
			t.Errorf("requests of a Wait of a claimed object: %v, want one get", got)
		}
		// A claim written after the list: the protocol writes none while this replica leads.
		late := newRegistry(cs, clk, "late")
		c := late.Begin(ctrl, objNS, "c", "3").(*Call)
		if _, err := late.Take(ctx, c, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		defer c.End()
		requests(cs)
		if w, err := succ.Wait(ctx, ctrl, objNS, "c"); err != nil || w != (internal.ClaimWait{}) || len(requests(cs)) != 0 {
			t.Errorf("Wait(c) of a claim written after the list = %+v, %v; want none, no request", w, err)
		}
	})
}

// A killed holder's claim, never renewed nor deleted, expires by the successor's clock and is
// deleted by it, with the resourceVersion read as a precondition; then read no more.
func TestWaitDeletesExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		ctx := context.Background()
		leader := newRegistry(cs, clk, leaderID)
		a := takeA(t, cs, leader)
		defer a.End()
		succ := newRegistry(cs, clk, "successor")
		if w, err := succ.Wait(ctx, ctrl, objNS, "a"); err != nil || w.Left != 20*time.Second {
			t.Fatalf("Wait(a) = %+v, %v; want held 20s", w, err)
		}
		leader.Stop()
		clk.Step(20 * time.Second)
		synctest.Wait()
		requests(cs)
		if w, err := succ.Wait(ctx, ctrl, objNS, "a"); err != nil || w != (internal.ClaimWait{}) {
			t.Errorf("Wait(a) once expired = %+v, %v; want none", w, err)
		}
		var del *k8stesting.DeleteActionImpl
		for _, act := range cs.Actions() {
			if d, ok := act.(k8stesting.DeleteActionImpl); ok {
				del = &d
			}
		}
		if del == nil || del.Name != Name(ctrl, objNS, "a") || del.DeleteOptions.Preconditions == nil ||
			ptr.Deref(del.DeleteOptions.Preconditions.ResourceVersion, "") != "7" {
			t.Errorf("the expired claim's delete: %+v, want one of %s with resourceVersion 7 as precondition", del, Name(ctrl, objNS, "a"))
		}
		if _, err := cs.CoordinationV1().Leases(ns).Get(ctx, Name(ctrl, objNS, "a"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the expired claim after Wait: %v, want NotFound", err)
		}
		requests(cs)
		if w, err := succ.Wait(ctx, ctrl, objNS, "a"); err != nil || w != (internal.ClaimWait{}) || len(requests(cs)) != 0 {
			t.Errorf("Wait(a) after its claim was deleted = %+v, %v; want none, no request", w, err)
		}
	})
}

// Release gives a claim up while its reconcile still runs (a hand-over that did not happen);
// Stop stops renewing what is left without deleting it.
func TestReleaseAndStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := newRegistry(cs, clk, leaderID)
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

// Held lists the claims held, oldest first, with how long ago each was taken and renewed;
// Waiting lists other replicas' claims unexpired by this replica's reads, soonest to expire
// first, with the holder and the time left. Both cap the list and count all.
func TestHeldAndWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := fake.NewClientset()
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		leader := newRegistry(cs, clk, leaderID)
		succ := newRegistry(cs, clk, "successor")
		ctx := context.Background()
		a := leader.Begin(ctrl, objNS, "a", "1").(*Call)
		if _, err := leader.Take(ctx, a, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // its renewals wait on the clock
		clk.Step(time.Second)
		b := leader.Begin(ctrl, objNS, "b", "2").(*Call)
		if _, err := leader.Take(ctx, b, 15*time.Second); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		clk.Step(time.Second) // a renewed at 2s
		synctest.Wait()
		clk.Step(time.Second) // b renewed at 3s
		synctest.Wait()
		held, n := leader.Held(10)
		want := []Held{
			{Object: objNS + "/a", Controller: ctrl, Claim: Name(ctrl, objNS, "a"), Since: "3s", Renewed: "1s"},
			{Object: objNS + "/b", Controller: ctrl, Claim: Name(ctrl, objNS, "b"), Since: "2s", Renewed: "0s"},
		}
		if n != 2 || !slices.Equal(held, want) {
			t.Errorf("Held(10) = %+v, %d; want %+v, 2", held, n, want)
		}
		if held, n := leader.Held(1); n != 2 || !slices.Equal(held, want[:1]) {
			t.Errorf("Held(1) = %+v, %d; want %+v, 2", held, n, want[:1])
		}
		if held, n := succ.Held(10); n != 0 || len(held) != 0 {
			t.Errorf("successor's Held = %+v, %d; want none", held, n)
		}

		for _, o := range []string{"a", "b"} {
			if w, err := succ.Wait(ctx, ctrl, objNS, o); err != nil || w.Left == 0 {
				t.Fatalf("Wait(%s) = %+v, %v; want held", o, w, err)
			}
		}
		waiting, n := succ.Waiting(10)
		wantW := []Waited{
			{Object: objNS + "/b", Controller: ctrl, Claim: Name(ctrl, objNS, "b"), Holder: leaderID, Left: "15s"},
			{Object: objNS + "/a", Controller: ctrl, Claim: Name(ctrl, objNS, "a"), Holder: leaderID, Left: "20s"},
		}
		if n != 2 || !slices.Equal(waiting, wantW) {
			t.Errorf("Waiting(10) = %+v, %d; want %+v, 2", waiting, n, wantW)
		}
		if waiting, n := succ.Waiting(1); n != 2 || !slices.Equal(waiting, wantW[:1]) {
			t.Errorf("Waiting(1) = %+v, %d; want %+v, 2", waiting, n, wantW[:1])
		}
		if waiting, n := leader.Waiting(10); n != 0 || len(waiting) != 0 {
			t.Errorf("leader's Waiting = %+v, %d; want none (its own claims)", waiting, n)
		}
		for range 8 { // 16s by the successor's clock: b expired, a has 4s left
			clk.Step(retryPeriod)
			synctest.Wait()
		}
		wantA := wantW[1]
		wantA.Left = "4s"
		if waiting, n := succ.Waiting(10); n != 1 || !slices.Equal(waiting, []Waited{wantA}) {
			t.Errorf("Waiting 16s later = %+v, %d; want %+v, 1", waiting, n, wantA)
		}

		// a released and claimed by another holder before the successor reads it again: First
		// again; then released: gone from Waiting.
		a.End()
		third := newRegistry(cs, clk, "third")
		a3 := third.Begin(ctrl, objNS, "a", "3").(*Call)
		if _, err := third.Take(ctx, a3, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if w, err := succ.Wait(ctx, ctrl, objNS, "a"); err != nil || !w.First || w.Holder != "third" {
			t.Errorf("Wait on a claim of a new holder = %+v, %v; want First, held by third", w, err)
		}
		if _, n := leader.Held(0); n != 1 {
			t.Errorf("leader holds %d claims after a ended, want 1", n)
		}
		a3.End()
		if w, err := succ.Wait(ctx, ctrl, objNS, "a"); err != nil || w != (internal.ClaimWait{}) {
			t.Fatalf("Wait on a released claim = %+v, %v", w, err)
		}
		if _, n := succ.Waiting(10); n != 0 {
			t.Errorf("Waiting counts %d after the claims were released or expired, want 0", n)
		}
		b.End()
	})
}
