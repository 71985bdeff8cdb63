package reconcilers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// manyClient is a fake client holding the ConfigMaps ns/cm-0 .. ns/cm-<n-1>.
func manyClient(n int) client.Client {
	b := fake.NewClientBuilder()
	for i := range n {
		name := fmt.Sprint("cm-", i)
		b = b.WithObjects(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}})
	}
	return b.Build()
}

// eventsBy returns the Events of rec with reason, by object name; it fails on two for one
// object, or an Event that does not say where the reconcile waits.
func eventsBy(t *testing.T, rec *recorder, reason string) map[string]recordedEvent {
	t.Helper()
	out := map[string]recordedEvent{}
	for _, e := range rec.all() {
		if e.reason != reason {
			continue
		}
		name := e.name()
		if _, dup := out[name]; dup {
			t.Fatalf("two %s Events for %s", reason, name)
		}
		ref, _ := e.regarding.(*corev1.ObjectReference)
		if !strings.Contains(e.note, " in reconcilers_test.") || strings.Contains(e.note, ".go") || ref == nil || ref.UID != types.UID("uid-"+name) {
			t.Fatalf("%s Event %+v: want it on its object, saying where the reconcile waits", reason, e)
		}
		out[name] = e
	}
	return out
}

// More slow reconciles than a "Slow calls" line lists (20) each get their ReconcileSlow
// Event, and each abandoned one its ReconcileAbandoned.
func TestRecorderRecordsEverySlowReconcile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 25
		rec := &recorder{}
		c := manyClient(n)
		ex := drain.New(drain.Options{SlowAfter: time.Second})
		started := make(chan string)
		release := make(chan struct{})
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), eventOptions(rec, c))
		done := make(chan error, n)
		for i := range n {
			go func() {
				_, err := r.Reconcile(context.Background(), request("ns", fmt.Sprint("cm-", i)))
				done <- err
			}()
			<-started
		}

		time.Sleep(time.Second) // fake time: all turn slow, the line is logged
		synctest.Wait()
		if got := eventsBy(t, rec, reconcilers.ReasonReconcileSlow); len(got) != n {
			t.Fatalf("%d ReconcileSlow Events, want %d (one per slow reconcile)", len(got), n)
		}

		internal.Of(ex).Abandoned(context.Background())
		if got := eventsBy(t, rec, reconcilers.ReasonReconcileAbandoned); len(got) != n {
			t.Fatalf("%d ReconcileAbandoned Events, want %d", len(got), n)
		}

		close(release)
		errs := make([]error, 0, n+1)
		for range n {
			errs = append(errs, <-done)
		}
		if err := errors.Join(append(errs, ex.Drain(context.Background()))...); err != nil {
			t.Fatal(err)
		}
	})
}

// At most internal.MaxObserved slow reconciles per line get their Event: the oldest.
func TestRecorderSlowBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = internal.MaxObserved + 5
		rec := &recorder{}
		c := manyClient(n)
		ex := drain.New(drain.Options{SlowAfter: time.Second})
		started := make(chan string)
		release := make(chan struct{})
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), eventOptions(rec, c))
		done := make(chan error, n)
		for i := range n {
			go func() {
				_, err := r.Reconcile(context.Background(), request("ns", fmt.Sprint("cm-", i)))
				done <- err
			}()
			<-started
		}

		time.Sleep(time.Second)
		synctest.Wait()
		got := eventsBy(t, rec, reconcilers.ReasonReconcileSlow)
		if len(got) != internal.MaxObserved {
			t.Fatalf("%d ReconcileSlow Events, want %d (the bound)", len(got), internal.MaxObserved)
		}
		for i := range internal.MaxObserved {
			if _, ok := got[fmt.Sprint("cm-", i)]; !ok {
				t.Fatalf("no ReconcileSlow Event for cm-%d: want the oldest %d", i, internal.MaxObserved)
			}
		}

		close(release)
		errs := make([]error, 0, n+1)
		for range n {
			errs = append(errs, <-done)
		}
		if err := errors.Join(append(errs, ex.Drain(context.Background()))...); err != nil {
			t.Fatal(err)
		}
	})
}
