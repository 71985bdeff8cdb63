package runnable

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/quiesce-dev/quiesce/internal/claims"
)

// counterValue returns the value of v's counter for claimsCtrl.
func counterValue(t *testing.T, v *prometheus.CounterVec) float64 {
	t.Helper()
	m := &dto.Metric{}
	if err := v.WithLabelValues(claimsCtrl).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// claimsCtrl is the controller of TestClaimsObservable: the counters are process-wide.
const claimsCtrl = "claims-observable"

// claimsRunnable is a Runnable whose claims, in a fake API server, count in the metrics.
func claimsRunnable(clk *clocktesting.FakeClock, cs *fake.Clientset) *Runnable {
	r := New(Options{Clock: clk}).r
	o := claims.Options{Leases: cs.CoordinationV1().Leases("operator"), Identity: "me",
		RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second, Clock: clk, Logger: logr.Discard()}
	claimMetrics(&o)
	r.claims = claims.New(o)
	return r
}

// /debug/quiesce shows the claims held and waited on, under the view's limit; the metrics
// count the claims held, the waits, the failed renewals and the fences, by controller.
func TestClaimsObservable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ctrl = claimsCtrl
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		cs := fake.NewClientset()
		r := claimsRunnable(clk, cs)
		ctx := context.Background()
		calls := make([]*claims.Call, 0, 2)
		for _, name := range []string{"a", "b"} {
			c := r.claims.Begin(ctrl, "ns", name, "id-"+name).(*claims.Call)
			if _, err := r.claims.Take(ctx, c, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			calls = append(calls, c)
			synctest.Wait() // its renewals wait on the clock
			clk.Step(time.Second)
		}
		synctest.Wait() // a renewed at 2s
		now := metav1.NewMicroTime(clk.Now())
		if _, err := cs.CoordinationV1().Leases("operator").Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: claims.Name(ctrl, "ns", "x"), Labels: map[string]string{claims.ControllerLabel: ctrl}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other"), LeaseDurationSeconds: ptr.To[int32](30),
				RenewTime: &now, AcquireTime: &now},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waits := counterValue(t, claimWaits)
		if w, err := r.claims.Wait(ctx, ctrl, "ns", "x"); err != nil || w.Left != 30*time.Second {
			t.Fatalf("Wait = %+v, %v; want 30s left", w, err)
		}
		if got := counterValue(t, claimWaits) - waits; got != 1 {
			t.Errorf("quiesce_claim_waits_total grew by %v, want 1", got)
		}

		get := func(target string) debugState {
			t.Helper()
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
			var s debugState
			if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.Claims == nil {
				t.Fatalf("GET %s: %v, claims %v: %s", target, err, s.Claims, rec.Body)
			}
			return s
		}
		s := get("/debug/quiesce")
		wantHeld := []claims.Held{
			{Object: "ns/a", Controller: ctrl, Claim: claims.Name(ctrl, "ns", "a"), Since: "2s", Renewed: "0s"},
			{Object: "ns/b", Controller: ctrl, Claim: claims.Name(ctrl, "ns", "b"), Since: "1s", Renewed: "1s"},
		}
		wantWaiting := []claims.Waited{{Object: "ns/x", Controller: ctrl, Claim: claims.Name(ctrl, "ns", "x"),
			Holder: "other", Left: "30s"}}
		c := s.Claims
		if c.HeldCount != 2 || c.WaitingCount != 1 || s.Truncated ||
			len(c.Held) != 2 || c.Held[0] != wantHeld[0] || c.Held[1] != wantHeld[1] ||
			len(c.Waiting) != 1 || c.Waiting[0] != wantWaiting[0] {
			t.Errorf("claims %+v, truncated %v; want held %+v, waiting %+v", c, s.Truncated, wantHeld, wantWaiting)
		}
		// As for calls, truncated says only when the caps cut a list short of the limit asked.
		if s := get("/debug/quiesce?limit=1"); len(s.Claims.Held) != 1 || s.Claims.Held[0] != wantHeld[0] ||
			s.Claims.HeldCount != 2 || s.Truncated {
			t.Errorf("?limit=1: held %+v of %d, truncated %v; want the oldest of 2", s.Claims.Held, s.Claims.HeldCount, s.Truncated)
		}
		if s := get("/debug/quiesce?limit=0"); len(s.Claims.Held)+len(s.Claims.Waiting) != 0 ||
			s.Claims.HeldCount != 2 || s.Claims.WaitingCount != 1 {
			t.Errorf("?limit=0: %+v; want the counts alone", s.Claims)
		}

		stats := &statsCollector{live: make(map[*Runnable]struct{})}
		stats.track(r)
		if got := collect(t, stats)["quiesce_claims_held"]; got != 2 {
			t.Errorf("quiesce_claims_held = %v, want 2", got)
		}

		failed, fences := counterValue(t, claimRenewalsFailed), counterValue(t, claimFences)
		cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("connection refused")
		})
		for range 6 { // 12s: past the renew deadline of both claims
			synctest.Wait()
			clk.Step(2 * time.Second)
		}
		synctest.Wait()
		if got := counterValue(t, claimRenewalsFailed) - failed; got < 4 {
			t.Errorf("quiesce_claim_renewals_failed_total grew by %v, want at least 4", got)
		}
		if got := counterValue(t, claimFences) - fences; got != 2 {
			t.Errorf("quiesce_claim_fences_total grew by %v, want 2", got)
		}
		for _, c := range calls {
			c.End()
		}
		if got := collect(t, stats)["quiesce_claims_held"]; got != 0 {
			t.Errorf("quiesce_claims_held after the work ended = %v, want 0", got)
		}
	})
}

// The claims listed share the view's 256 KiB cap with the calls: past it, the lists are cut
// and truncated says so; the counts stay whole.
func TestClaimsInDebugViewAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		r := claimsRunnable(clk, fake.NewClientset())
		long := strings.Repeat("n", 300) // cut to 256 bytes in the view
		calls := make([]*claims.Call, 0, maxDebugCalls)
		for i := range maxDebugCalls {
			c := r.claims.Begin(claimsCtrl, "ns", long+strconv.Itoa(i), "id").(*claims.Call)
			if _, err := r.claims.Take(context.Background(), c, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			calls = append(calls, c)
		}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/quiesce?limit=all", nil))
		var s debugState
		if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil || s.Claims == nil {
			t.Fatalf("%v, claims %v", err, s.Claims)
		}
		if n := len(s.Claims.Held); n == 0 || n >= maxDebugCalls || s.Claims.HeldCount != maxDebugCalls || !s.Truncated {
			t.Errorf("held %d of %d, truncated %v; want a cut list of all %d counted, truncated",
				n, s.Claims.HeldCount, s.Truncated, maxDebugCalls)
		}
		if n := rec.Body.Len(); n > maxDebugBytes+4<<10 {
			t.Errorf("answer of %d bytes, want about %d at most", n, maxDebugBytes)
		}
		for _, c := range calls {
			c.End()
		}
	})
}
