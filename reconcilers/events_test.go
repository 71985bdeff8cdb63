package reconcilers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// eventsClient is a fake client holding ConfigMaps ns/a and ns/b.
func eventsClient(funcs interceptor.Funcs) client.Client {
	cm := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-ns-" + name)}}
	}
	return interceptor.NewClient(fake.NewClientBuilder().WithObjects(cm("a"), cm("b")).Build(), funcs)
}

// recorded returns the Events c holds, by object name and reason.
func recorded(t *testing.T, c client.Client) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func reasons(evs []corev1.Event) string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.InvolvedObject.Name+":"+e.Reason)
	}
	return strings.Join(out, ",")
}

// blocker is a reconciler that blocks each reconcile until release is closed.
func blocker(started chan<- string, release <-chan struct{}) reconcile.Reconciler {
	return reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
		started <- req.Name
		<-release
		return reconcile.Result{}, nil
	})
}

func TestWithEventsRecordsSlowOncePerObjectWhileSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := eventsClient(interceptor.Funcs{})
		ex := drain.New(drain.Options{SlowAfter: time.Second, ReportEvery: time.Second})
		started := make(chan string)
		release := make(chan struct{})
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), reconcilers.WithEvents(c, &corev1.ConfigMap{}))
		reconcileAsync := func(name string) <-chan error {
			done := make(chan error, 1)
			go func() {
				_, err := r.Reconcile(context.Background(), request("ns", name))
				done <- err
			}()
			<-started
			return done
		}

		done := reconcileAsync("a")
		time.Sleep(1500 * time.Millisecond) // fake time: a turns slow, the line is logged
		synctest.Wait()
		evs := recorded(t, c)
		if got := reasons(evs); got != "a:ReconcileSlow" {
			t.Fatalf("events after a turned slow = %q, want a:ReconcileSlow", got)
		}
		e := evs[0]
		if e.Type != corev1.EventTypeWarning || e.InvolvedObject.UID != "uid-ns-a" || e.InvolvedObject.Kind != "ConfigMap" ||
			e.Namespace != "ns" || !strings.Contains(e.Message, "cms/ns/a") || !strings.Contains(e.Message, "events_test.go") {
			t.Fatalf("slow event = %+v, want a Warning on ConfigMap ns/a (uid-ns-a) naming the call and its line", e)
		}

		// An hour of staying slow, with b turning slow too: one Event each, no more.
		doneB := reconcileAsync("b")
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := reasons(recorded(t, c)); got != "a:ReconcileSlow,b:ReconcileSlow" {
			t.Fatalf("events after an hour = %q, want one slow Event per object", got)
		}

		// Once a's reconcile returned, a slow reconcile of a again is a new Event.
		release <- struct{}{}
		release <- struct{}{}
		if err := errors.Join(<-done, <-doneB); err != nil {
			t.Fatal(err)
		}
		done = reconcileAsync("a")
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if got := reasons(recorded(t, c)); got != "a:ReconcileSlow,a:ReconcileSlow,b:ReconcileSlow" {
			t.Fatalf("events after a slow again = %q, want a second slow Event for a", got)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := ex.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestWithEventsRecordsAbandonedReconcilesOncePerObject(t *testing.T) {
	c := eventsClient(interceptor.Funcs{})
	ex := drain.New(drain.Options{})
	started := make(chan string)
	release := make(chan struct{})
	inner := reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		// a handler call inside the reconcile: the object gets one Event, not two.
		return reconcile.Result{}, reconcilers.Call(ctx, "export", func(context.Context) error {
			started <- req.Name
			<-release
			return nil
		})
	})
	r := reconcilers.Wrap(ex, "cms", inner, reconcilers.WithEvents(c, &corev1.ConfigMap{}))
	done := make(chan error, 1)
	go func() {
		_, err := r.Reconcile(context.Background(), request("ns", "a"))
		done <- err
	}()
	<-started
	// A call that is not a wrapped reconcile, and a reconcile of an object that is gone.
	other := make(chan struct{})
	if err := ex.Go(context.Background(), "plain", func(context.Context) error { <-other; return nil }); err != nil {
		t.Fatal(err)
	}
	gone := make(chan error, 1)
	go func() {
		_, err := r.Reconcile(context.Background(), request("ns", "gone"))
		gone <- err
	}()
	<-started

	internal.Of(ex).Abandoned(context.Background())

	evs := recorded(t, c)
	if got := reasons(evs); got != "a:ReconcileAbandoned" {
		t.Fatalf("events = %q, want one ReconcileAbandoned on a", got)
	}
	if m := evs[0].Message; !strings.Contains(m, "cms/ns/a/export") || !strings.Contains(m, "events_test.go") {
		t.Fatalf("message = %q, want the innermost call and its line", m)
	}
	close(release)
	close(other)
	if err := errors.Join(<-done, <-gone, ex.Drain(context.Background())); err != nil {
		t.Fatal(err)
	}
}

func TestWithEventsFailureIsLoggedOnceAndBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		creates := 0
		c := eventsClient(interceptor.Funcs{Create: func(ctx context.Context, _ client.WithWatch, _ client.Object, _ ...client.CreateOption) error {
			creates++
			<-ctx.Done() // an API server that never answers
			return ctx.Err()
		}})
		ex := drain.New(drain.Options{Logger: logs.logger(0)})
		started := make(chan string)
		release := make(chan struct{})
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), reconcilers.WithEvents(c, &corev1.ConfigMap{}))
		done := make(chan error, 2)
		for _, name := range []string{"a", "b"} {
			go func() {
				_, err := r.Reconcile(context.Background(), request("ns", name))
				done <- err
			}()
			<-started
		}

		begin := time.Now()
		internal.Of(ex).Abandoned(context.Background())
		if took := time.Since(begin); took != reconcilers.EventTimeout {
			t.Fatalf("Abandoned took %v, want EventTimeout (%v): the writes are bounded", took, reconcilers.EventTimeout)
		}
		var failed []string
		for _, l := range logs.all() {
			if strings.Contains(l, "Failed to record an Event") {
				failed = append(failed, l)
			}
		}
		if creates != 2 || len(failed) != 1 {
			t.Fatalf("creates = %d, failure lines = %q; want 2 attempts and one line", creates, failed)
		}
		close(release)
		if err := errors.Join(<-done, <-done, ex.Drain(context.Background())); err != nil {
			t.Fatal(err)
		}
	})
}

type typedReq struct{ _ string }

func TestWithEventsNeedsRequests(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(v.(string), "WithEvents") {
			t.Fatalf("recover() = %v, want a panic naming WithEvents", v)
		}
	}()
	reconcilers.WrapTyped(drain.New(drain.Options{}), "typed",
		reconcile.TypedFunc[typedReq](func(context.Context, typedReq) (reconcile.Result, error) { return reconcile.Result{}, nil }),
		reconcilers.WithEvents(eventsClient(interceptor.Funcs{}), &corev1.ConfigMap{}))
}

func TestEventTimeout(t *testing.T) {
	if reconcilers.EventTimeout != internal.ObserveTimeout {
		t.Fatalf("EventTimeout = %v, but the runnable waits %v for the abandoned Events", reconcilers.EventTimeout, internal.ObserveTimeout)
	}
}
