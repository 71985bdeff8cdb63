package reconcilers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// recordedEvent is one Event handed to a recorder.
type recordedEvent struct {
	regarding     runtime.Object
	typ, reason   string
	action, note  string
	relatedWasNil bool
}

// name returns the name of the Event's object.
func (e recordedEvent) name() string {
	if ref, ok := e.regarding.(*corev1.ObjectReference); ok {
		return ref.Name
	}
	if o, ok := e.regarding.(client.Object); ok {
		return o.GetName()
	}
	return "?"
}

// recorder is an events.EventRecorder that keeps what it is given, with the regarding object
// (events.FakeRecorder keeps only the text).
type recorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (r *recorder) Eventf(regarding, related runtime.Object, typ, reason, action, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recordedEvent{regarding: regarding, typ: typ, reason: reason, action: action,
		note: fmtNote(note, args), relatedWasNil: related == nil})
}

func fmtNote(note string, args []any) string {
	if note == "%s" && len(args) == 1 {
		if s, ok := args[0].(string); ok {
			return s
		}
	}
	return "unexpected note format " + note
}

func (r *recorder) all() []recordedEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recordedEvent(nil), r.events...)
}

// eventOptions are the Options recording Events of ConfigMaps read from c to rec.
func eventOptions(rec *recorder, c client.Reader) reconcilers.WrapOptions {
	return reconcilers.WrapOptions{Recorder: rec, Reader: c, Object: &corev1.ConfigMap{}}
}

func reasons(evs []recordedEvent) string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.name()+":"+e.reason)
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

func TestRecorderRecordsSlowOncePerObjectWhileSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		ex := drain.New(drain.Options{SlowAfter: time.Second, ReportEvery: time.Second})
		started := make(chan string)
		release := make(chan struct{})
		opts := eventOptions(rec, eventsClient(interceptor.Funcs{}))
		opts.EventLocations = true
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), opts)
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
		evs := rec.all()
		if got := reasons(evs); got != "a:ReconcileSlow" {
			t.Fatalf("events after a turned slow = %q, want a:ReconcileSlow", got)
		}
		e := evs[0]
		ref, _ := e.regarding.(*corev1.ObjectReference)
		if ref == nil || ref.UID != "uid-ns-a" || ref.Kind != "ConfigMap" || ref.APIVersion != "v1" || ref.Namespace != "ns" {
			t.Fatalf("regarding = %#v, want a reference to ConfigMap ns/a with its UID (kubectl describe matches it)", e.regarding)
		}
		if e.typ != corev1.EventTypeWarning || e.action != "Reconcile" || !e.relatedWasNil ||
			!strings.Contains(e.note, "cms/ns/a") || !strings.Contains(e.note, "events_test.go") {
			t.Fatalf("slow event = %+v, want a Warning naming the call and its line (EventLocations)", e)
		}

		// An hour of staying slow, with b turning slow too: one Event each, no more.
		doneB := reconcileAsync("b")
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := reasons(rec.all()); got != "a:ReconcileSlow,b:ReconcileSlow" {
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
		if got := reasons(rec.all()); got != "a:ReconcileSlow,b:ReconcileSlow,a:ReconcileSlow" {
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

func TestRecorderRecordsAbandonedReconcilesOncePerObject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
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
		r := reconcilers.Wrap(ex, "cms", inner, eventOptions(rec, eventsClient(interceptor.Funcs{})))
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

		begin := time.Now()
		internal.Of(ex).Abandoned(context.Background())
		if took := time.Since(begin); took != 0 {
			t.Fatalf("Abandoned took %v, want no wait: the recorder sends asynchronously", took)
		}

		evs := rec.all()
		if got := reasons(evs); got != "a:ReconcileAbandoned" {
			t.Fatalf("events = %q, want one ReconcileAbandoned on a", got)
		}
		// Without EventLocations: the function where it waits, not its file and line.
		if n := evs[0].note; !strings.Contains(n, "cms/ns/a/export") ||
			!strings.Contains(n, "handler reconcilers_test.TestRecorderRecordsAbandonedReconcilesOncePerObject.") ||
			strings.Contains(n, ".go") {
			t.Fatalf("note = %q, want the innermost call and its function, without file:line", n)
		}
		close(release)
		close(other)
		if err := errors.Join(<-done, <-gone, ex.Drain(context.Background())); err != nil {
			t.Fatal(err)
		}
	})
}

// A reader that fails: no Event, one log line for all failures, and no wait.
func TestRecorderReadFailureIsLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs capture
		var mu sync.Mutex
		gets := 0
		c := eventsClient(interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			mu.Lock()
			defer mu.Unlock()
			gets++
			return errors.New("cache broken")
		}})
		rec := &recorder{}
		ex := drain.New(drain.Options{Logger: logs.logger(0)})
		started := make(chan string)
		release := make(chan struct{})
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), eventOptions(rec, c))
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
		if took := time.Since(begin); took != 0 {
			t.Fatalf("Abandoned took %v, want no wait", took)
		}
		var failed []string
		for _, l := range logs.all() {
			if strings.Contains(l, "Failed to record an Event") {
				failed = append(failed, l)
			}
		}
		mu.Lock()
		n := gets
		mu.Unlock()
		if n != 2 || len(failed) != 1 || len(rec.all()) != 0 {
			t.Fatalf("gets = %d, failure lines = %q, events = %d; want 2 reads, one line, no Event", n, failed, len(rec.all()))
		}
		close(release)
		if err := errors.Join(<-done, <-done, ex.Drain(context.Background())); err != nil {
			t.Fatal(err)
		}
	})
}

// A reader that knows no scheme: the object read is the Event's regarding object, and the
// recorder's scheme finds its kind.
func TestRecorderReaderWithoutScheme(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		ex := drain.New(drain.Options{})
		started := make(chan string)
		release := make(chan struct{})
		reader := struct{ client.Reader }{eventsClient(interceptor.Funcs{})}
		r := reconcilers.Wrap(ex, "cms", blocker(started, release), eventOptions(rec, reader))
		done := make(chan error, 1)
		go func() {
			_, err := r.Reconcile(context.Background(), request("ns", "a"))
			done <- err
		}()
		<-started
		internal.Of(ex).Abandoned(context.Background())
		evs := rec.all()
		if len(evs) != 1 {
			t.Fatalf("events = %q, want one", reasons(evs))
		}
		if cm, ok := evs[0].regarding.(*corev1.ConfigMap); !ok || cm.UID != "uid-ns-a" {
			t.Fatalf("regarding = %#v, want ConfigMap ns/a as read, with its UID", evs[0].regarding)
		}
		close(release)
		if err := errors.Join(<-done, ex.Drain(context.Background())); err != nil {
			t.Fatal(err)
		}
	})
}

type typedReq struct{ _ string }

// A misconfigured Recorder panics at Wrap, naming what is missing.
func TestRecorderMisconfigurationPanicsAtSetup(t *testing.T) {
	c := eventsClient(interceptor.Funcs{})
	typed := reconcile.TypedFunc[typedReq](func(context.Context, typedReq) (reconcile.Result, error) { return reconcile.Result{}, nil })
	noop := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil })
	for name, tc := range map[string]struct {
		wrap func(ex *drain.Executor)
		want string
	}{
		"typed requests": {func(ex *drain.Executor) {
			reconcilers.WrapTyped(ex, "typed", typed, eventOptions(&recorder{}, c))
		}, "needs reconcile.Request requests, not reconcilers_test.typedReq"},
		"no reader": {func(ex *drain.Executor) {
			reconcilers.Wrap(ex, "cms", noop, reconcilers.WrapOptions{Recorder: &recorder{}, Object: &corev1.ConfigMap{}})
		}, "Reader nil: true, Object nil: false"},
		"no object": {func(ex *drain.Executor) {
			reconcilers.Wrap(ex, "cms", noop, reconcilers.WrapOptions{Recorder: &recorder{}, Reader: c, Object: (*corev1.ConfigMap)(nil)})
		}, "Reader nil: false, Object nil: true"},
	} {
		t.Run(name, func(t *testing.T) {
			ex := drain.New(drain.Options{})
			defer func() {
				v := recover()
				s, _ := v.(string)
				if !strings.Contains(s, "Options.Recorder needs") || !strings.Contains(s, tc.want) {
					t.Fatalf("recover() = %v, want a panic saying %q", v, tc.want)
				}
			}()
			tc.wrap(ex)
			t.Fatal("no panic")
		})
	}
}

// Without a Recorder (nil, or a nil pointer), Reader and Object are ignored: the zero
// Options are valid.
func TestNoRecorderNoEvents(t *testing.T) {
	ex := drain.New(drain.Options{})
	noop := reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil })
	reconcilers.Wrap(ex, "cms", noop, reconcilers.WrapOptions{Reader: eventsClient(interceptor.Funcs{})})
	reconcilers.Wrap(ex, "cms", noop, reconcilers.WrapOptions{Recorder: (*recorder)(nil)})
	if n := len(internal.Of(ex).Settings().Observers.List()); n != 0 {
		t.Fatalf("%d observers without a Recorder, want 0", n)
	}
}
