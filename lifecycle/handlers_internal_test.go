package lifecycle

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// fixJitter makes jitterRand return r for the rest of the test.
func fixJitter(t *testing.T, r float64) {
	t.Helper()
	old := jitterRand
	jitterRand = func() float64 { return r }
	t.Cleanup(func() { jitterRand = old })
}

func backoffOf(backoff, maxBackoff time.Duration) func(int) time.Duration {
	h := &handlersReconciler[*corev1.ConfigMap]{opts: HandlersOptions{Backoff: backoff, MaxBackoff: maxBackoff}}
	h.opts.setDefaults()
	return h.backoff
}

func TestHandlersBackoffDoublesUpToTheCap(t *testing.T) {
	fixJitter(t, 0)
	backoff := backoffOf(time.Second, time.Minute)
	for retries, want := range []time.Duration{1: time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 32 * time.Second, time.Minute, time.Minute} {
		if retries == 0 {
			continue
		}
		if got := backoff(retries); got != want {
			t.Errorf("backoff(%d) = %v, want %v", retries, got, want)
		}
	}
	if got := backoffOf(0, 0)(1); got != reconcilers.DefaultBackoff {
		t.Errorf("default backoff(1) = %v, want %v", got, reconcilers.DefaultBackoff)
	}
	if got := backoffOf(0, 0)(100); got != reconcilers.DefaultMaxBackoff {
		t.Errorf("default backoff(100) = %v, want %v", got, reconcilers.DefaultMaxBackoff)
	}
	if got := backoffOf(time.Hour, time.Minute)(3); got != time.Hour {
		t.Errorf("backoff with MaxBackoff below Backoff = %v, want Backoff", got)
	}
}

func TestHandlersBackoffJitterShortensByUpToATenth(t *testing.T) {
	backoff := backoffOf(time.Second, time.Minute)
	for _, tc := range []struct {
		r       float64
		retries int
		want    time.Duration
	}{
		{0, 1, time.Second},
		{0.5, 1, 950 * time.Millisecond},
		{0.5, 3, 3800 * time.Millisecond},
		{0.5, 10, 57 * time.Second},
		{math.Nextafter(1, 0), 1, 900*time.Millisecond + 1},
		{math.Nextafter(1, 0), 100, 54*time.Second + 1},
	} {
		fixJitter(t, tc.r)
		if got := backoff(tc.retries); got != tc.want {
			t.Errorf("backoff(%d) with jitter %v = %v, want %v", tc.retries, tc.r, got, tc.want)
		}
	}
}

// TestHandlersBackoffNeverOverflows: wait.Backoff alone overflows to a negative delay with a cap
// near time.Duration's limit; the ceiling keeps every delay positive and at most a century.
func TestHandlersBackoffNeverOverflows(t *testing.T) {
	for _, r := range []float64{0, math.Nextafter(1, 0)} {
		fixJitter(t, r)
		for _, b := range []time.Duration{time.Nanosecond, time.Second, math.MaxInt64 / 2, math.MaxInt64} {
			backoff := backoffOf(b, math.MaxInt64)
			prev := time.Duration(0)
			for _, retries := range []int{1, 2, 39, 40, 41, 62, 63, 64, 65, 1000, math.MaxInt32, math.MaxInt} {
				got := backoff(retries)
				if got <= 0 || got > internal.BackoffCeiling || got < prev {
					t.Fatalf("Backoff %v, jitter %v: backoff(%d) = %v after %v, want growing within (0, %v]",
						b, r, retries, got, prev, internal.BackoffCeiling)
				}
				prev = got
			}
			if r == 0 && prev != internal.BackoffCeiling {
				t.Fatalf("Backoff %v: backoff(MaxInt) = %v, want the ceiling %v", b, prev, internal.BackoffCeiling)
			}
		}
	}
}

func TestHandlersRetriesSaturate(t *testing.T) {
	fixJitter(t, 0)
	h := &handlersReconciler[*corev1.ConfigMap]{opts: HandlersOptions{}}
	h.opts.setDefaults()
	hp := h.update(context.Background(), &corev1.ConfigMap{}, "h", Progress{Retries: math.MaxInt}, ranFailed, errors.New("boom"))
	if hp.Retries != math.MaxInt {
		t.Errorf("Retries = %d after a failure at math.MaxInt, want it to stay", hp.Retries)
	}
	if hp.Delayed == nil || hp.Delayed.Sub(h.opts.Clock.Now()) > h.opts.MaxBackoff {
		t.Errorf("Delayed = %v, want at most MaxBackoff away", hp.Delayed)
	}
}

func TestHandlersStoredDelayIsCapped(t *testing.T) {
	h := &handlersReconciler[*corev1.ConfigMap]{opts: HandlersOptions{MaxBackoff: time.Minute}}
	h.opts.setDefaults()
	const farID = "far"
	h.handlers = []Handler[*corev1.ConfigMap]{{ID: farID}, {ID: "near"}}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	far, near := now.AddDate(300, 0, 0), now.Add(30*time.Second)
	p := Record{Handlers: map[string]Progress{farID: {Retries: 1, Delayed: &far}, "near": {Retries: 1, Delayed: &near}}}
	todo, ready, soonest := h.todo(p, now)
	if len(todo) != 2 || len(ready) != 1 || ready[0] != farID || soonest != 30*time.Second {
		t.Errorf("todo = %v, ready = %v, soonest = %v; want the far-future delay not waited for", todo, ready, soonest)
	}
}
