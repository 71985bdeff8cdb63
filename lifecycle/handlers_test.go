package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/lifecycle"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

var epoch = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// objKey is the key of the object most tests reconcile, configMap("obj"); objCall is the
// name of the tracked call of its reconcile by the fixture's controller, cm.
var objKey = types.NamespacedName{Namespace: "ns", Name: "obj"}

const objCall = "cm/ns/obj"

// configMap is the test object, in namespace ns: generation 1, a label and an annotation of
// someone else's.
func configMap(name string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Namespace:   "ns",
		Name:        name,
		Generation:  1,
		Labels:      map[string]string{"app": "demo"},
		Annotations: map[string]string{"other.example/keep": "yes"},
	}}
}

// request is the request of the object called name in namespace "ns".
func request(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}}
}

// drained drains ex at the end of a test, so that no worker goroutine outlives it.
func drained(t *testing.T, ex *drain.Executor) {
	t.Helper()
	t.Cleanup(func() {
		if err := ex.Drain(context.Background()); err != nil {
			t.Errorf("Drain: %v", err)
		}
	})
}

func names(ps []drain.Pending) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

// journal records handler runs, in order.
type journal struct {
	mu   sync.Mutex
	runs []string
}

func (j *journal) add(s string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.runs = append(j.runs, s)
}

func (j *journal) all() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.runs...)
}

// ok is a handler that records its run and succeeds.
func ok(j *journal, id string) lifecycle.Handler[*corev1.ConfigMap] {
	return lifecycle.Handler[*corev1.ConfigMap]{ID: id, Fn: func(context.Context, *corev1.ConfigMap) error {
		j.add(id)
		return nil
	}}
}

type fixture struct {
	t     *testing.T
	ex    *drain.Executor
	c     client.Client
	rec   *events.FakeRecorder
	clock *clocktesting.FakePassiveClock
	r     reconcile.Reconciler
}

// newFixture makes a reconciler of hs on a fake client holding objs, with a fake clock, a
// recorder, UnsignedProgress unless opts has a ProgressKey, and opts' other fields as given.
func newFixture(t *testing.T, hs []lifecycle.Handler[*corev1.ConfigMap], opts lifecycle.HandlersOptions, objs ...client.Object) *fixture {
	t.Helper()
	return newFixtureWith(t, fake.NewClientBuilder().WithObjects(objs...).Build(), hs, opts)
}

func newFixtureWith(t *testing.T, c client.Client, hs []lifecycle.Handler[*corev1.ConfigMap], opts lifecycle.HandlersOptions) *fixture {
	t.Helper()
	return newNamedFixture(t, c, "cm", hs, opts)
}

// newNamedFixture is newFixtureWith for a reconciler of the given controller name.
func newNamedFixture(
	t *testing.T, c client.Client, controller string, hs []lifecycle.Handler[*corev1.ConfigMap], opts lifecycle.HandlersOptions,
) *fixture {
	t.Helper()
	f := &fixture{t: t, ex: drain.New(drain.Options{}), c: c, rec: events.NewFakeRecorder(100), clock: clocktesting.NewFakePassiveClock(epoch)}
	drained(t, f.ex)
	if opts.Recorder == nil {
		opts.Recorder = f.rec
	}
	if opts.Clock == nil {
		opts.Clock = f.clock
	}
	opts.UnsignedProgress = opts.ProgressKey == nil
	r, err := lifecycle.Handlers(f.ex, f.c, controller, nil, hs, opts)
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	return f
}

func (f *fixture) reconcile(name string) reconcile.Result {
	f.t.Helper()
	res, err := f.r.Reconcile(context.Background(), request(name))
	if err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
	return res
}

// object returns the object at objKey, as the fixture's client has it.
func (f *fixture) object() *corev1.ConfigMap {
	f.t.Helper()
	var cm corev1.ConfigMap
	if err := f.c.Get(context.Background(), objKey, &cm); err != nil {
		f.t.Fatal(err)
	}
	return &cm
}

// record returns the Record on the object at objKey.
func (f *fixture) record() lifecycle.Record {
	f.t.Helper()
	p, err := lifecycle.ParseRecord(f.object().Annotations[lifecycle.DefaultProgressAnnotation])
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestHandlersRejectsBadInput(t *testing.T) {
	ex := drain.New(drain.Options{})
	c := fake.NewClientBuilder().Build()
	fn := func(context.Context, *corev1.ConfigMap) error { return nil }
	type H = lifecycle.Handler[*corev1.ConfigMap]
	for _, tc := range []struct {
		name string
		ex   *drain.Executor
		c    client.Client
		ctrl string
		hs   []H
		opts lifecycle.HandlersOptions
		want string
	}{
		{"nil executor", nil, c, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{}, "nil executor"},
		{"nil client", ex, nil, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{}, "nil client"},
		{"empty controller", ex, c, "", []H{{"a", fn}}, lifecycle.HandlersOptions{}, "empty controller"},
		{"no handlers", ex, c, "cm", nil, lifecycle.HandlersOptions{}, "no handlers"},
		{"empty id", ex, c, "cm", []H{{"a", fn}, {"", fn}}, lifecycle.HandlersOptions{}, "handler 1 has an empty id"},
		{"duplicate id", ex, c, "cm", []H{{"a", fn}, {"a", fn}}, lifecycle.HandlersOptions{}, `duplicate handler id "a"`},
		{"nil fn", ex, c, "cm", []H{{"a", nil}}, lifecycle.HandlersOptions{}, `handler "a" has a nil Fn`},
		{"bad annotation", ex, c, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{Annotation: "not a key!"}, "annotation key"},
		{"neither key nor unsigned", ex, c, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{},
			"no ProgressKey: set HandlersOptions.ProgressKey to at least 32 random bytes that only the operator holds, " +
				"or UnsignedProgress to true if everyone who may patch the objects may also decide which handlers run"},
		{"both key and unsigned", ex, c, "cm", []H{{"a", fn}},
			lifecycle.HandlersOptions{ProgressKey: key, UnsignedProgress: true}, "both ProgressKey and UnsignedProgress are set"},
		{"empty key", ex, c, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{ProgressKey: []byte{}}, "ProgressKey has 0 bytes, want at least 32"},
		{"short key", ex, c, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{ProgressKey: key[:31]}, "ProgressKey has 31 bytes, want at least 32"},
		{"executor not of drain.New", &drain.Executor{}, c, "cm", []H{{"a", fn}}, lifecycle.HandlersOptions{UnsignedProgress: true},
			"not created by drain.New"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := lifecycle.Handlers(tc.ex, tc.c, tc.ctrl, nil, tc.hs, tc.opts)
			if r != nil || !errors.Is(err, lifecycle.ErrInvalidHandlers) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Handlers = %v, %v; want an ErrInvalidHandlers mentioning %q", r, err, tc.want)
			}
		})
	}
	// Setup misuse is an error, never a panic: a Wrap.Recorder without Wrap.Reader and
	// Wrap.Object (which Wrap alone panics on) gets Handlers' client and an object of newObj.
	if _, err := lifecycle.Handlers(ex, c, "cm", nil, []H{{"a", fn}},
		lifecycle.HandlersOptions{UnsignedProgress: true, Wrap: reconcilers.WrapOptions{Recorder: events.NewFakeRecorder(1)}}); err != nil {
		t.Errorf("Handlers with a Wrap.Recorder alone = %v, want its Reader and Object filled in", err)
	}
	// T not a pointer to a struct needs newObj.
	_, err := lifecycle.Handlers(ex, c, "cm", nil, []lifecycle.Handler[client.Object]{{ID: "a", Fn: func(context.Context, client.Object) error { return nil }}}, lifecycle.HandlersOptions{UnsignedProgress: true})
	if !errors.Is(err, lifecycle.ErrInvalidHandlers) || !strings.Contains(err.Error(), "newObj") {
		t.Fatalf("Handlers[client.Object] without newObj = %v, want ErrInvalidHandlers", err)
	}
	_, err = lifecycle.Handlers(ex, c, "cm", func() client.Object { return &corev1.ConfigMap{} }, []lifecycle.Handler[client.Object]{{ID: "a", Fn: func(context.Context, client.Object) error { return nil }}}, lifecycle.HandlersOptions{ProgressKey: key})
	if err != nil {
		t.Fatalf("Handlers[client.Object] with newObj = %v", err)
	}
}

func TestHandlersOneByOneRunsOneHandlerPerReconcile(t *testing.T) {
	var j journal
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b"), ok(&j, "c")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne, NextCycle: 5 * time.Millisecond}, configMap("obj"))

	for i, want := range [][]string{{"a"}, {"a", "b"}, {"a", "b", "c"}} {
		res := f.reconcile("obj")
		if got := j.all(); !slices.Equal(got, want) {
			t.Fatalf("after reconcile %d: runs %q, want %q", i+1, got, want)
		}
		wantRes := reconcile.Result{RequeueAfter: 5 * time.Millisecond}
		if i == 2 {
			wantRes = reconcile.Result{}
		}
		if res != wantRes {
			t.Fatalf("reconcile %d = %+v, want %+v", i+1, res, wantRes)
		}
	}
	// All done for the generation: nothing runs any more.
	if res := f.reconcile("obj"); res != (reconcile.Result{}) {
		t.Fatalf("reconcile when all done = %+v", res)
	}
	if got := strings.Join(j.all(), ","); got != "a,b,c" {
		t.Fatalf("runs %s after all done", got)
	}
	p := f.record()
	if p.Generation != 1 || len(p.Handlers) != 3 {
		t.Fatalf("progress = %+v", p)
	}
	for _, id := range []string{"a", "b", "c"} {
		h := p.Handlers[id]
		if !h.Done || h.Failed || h.Retries != 0 || h.Started == nil || !h.Started.Equal(epoch) || h.Message != "" {
			t.Fatalf("progress of %s = %+v, want done, started at %v", id, h, epoch)
		}
	}
}

func TestHandlersAllAtOnceRunsAllInOneReconcileInOrder(t *testing.T) {
	var j journal
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b"), ok(&j, "c")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.AllAtOnce}, configMap("obj"))
	if res := f.reconcile("obj"); res != (reconcile.Result{}) {
		t.Fatalf("Reconcile = %+v, want done", res)
	}
	if got := strings.Join(j.all(), ","); got != "a,b,c" {
		t.Fatalf("runs %s, want a,b,c", got)
	}
}

func TestHandlersDefaultLifecycleIsASAP(t *testing.T) {
	// a fails once; with ASAP (fewest retries first), b and c run before a's retry.
	var j journal
	failed := false
	a := lifecycle.Handler[*corev1.ConfigMap]{ID: "a", Fn: func(context.Context, *corev1.ConfigMap) error {
		j.add("a")
		if !failed {
			failed = true
			return errors.New("not yet")
		}
		return nil
	}}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{a, ok(&j, "b"), ok(&j, "c")},
		lifecycle.HandlersOptions{Backoff: time.Nanosecond}, configMap("obj"))
	for range 4 {
		f.clock.SetTime(f.clock.Now().Add(time.Second)) // every backoff is over
		f.reconcile("obj")
	}
	if got := strings.Join(j.all(), ","); got != "a,b,c,a" {
		t.Fatalf("runs %s, want a,b,c,a", got)
	}
}

// TestHandlersLifecycleNeverRunsThroughTheExecutor proves that the lifecycle is called
// inline: while it runs, the executor tracks only the reconcile itself, and the executor
// starts exactly one call per reconcile plus one per handler run.
func TestHandlersLifecycleNeverRunsThroughTheExecutor(t *testing.T) {
	var j journal
	var ex *drain.Executor
	var seen [][]string
	inline := func(pending []string, p map[string]lifecycle.Progress) []string {
		seen = append(seen, names(ex.Pending()))
		return lifecycle.AllAtOnce(pending, p)
	}
	var during []string
	hb := lifecycle.Handler[*corev1.ConfigMap]{ID: "b", Fn: func(context.Context, *corev1.ConfigMap) error {
		during = names(ex.Pending())
		return nil
	}}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), hb},
		lifecycle.HandlersOptions{Lifecycle: inline}, configMap("obj"))
	ex = f.ex
	f.reconcile("obj")
	f.reconcile("obj") // all done: the lifecycle is not even called

	if want := [][]string{{objCall}}; fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("pending calls while the lifecycle ran = %q, want %q", seen, want)
	}
	if want := []string{objCall, objCall + "/b"}; !slices.Equal(during, want) {
		t.Fatalf("pending calls while handler b ran = %q, want %q", during, want)
	}
	// 2 reconciles + 2 handler runs; no call for the lifecycle.
	if s := f.ex.Stats(); s.Started != 4 || s.Finished != 4 {
		t.Fatalf("executor stats = %+v, want 4 started and finished", s)
	}
}

func TestHandlersRetriesWithBackoff(t *testing.T) {
	fails := 0
	boom := lifecycle.Handler[*corev1.ConfigMap]{ID: "flaky", Fn: func(context.Context, *corev1.ConfigMap) error {
		fails++
		if fails <= 4 {
			return fmt.Errorf("failed to dial: attempt %d", fails)
		}
		return nil
	}}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{boom},
		lifecycle.HandlersOptions{Backoff: time.Second, MaxBackoff: 5 * time.Second}, configMap("obj"))

	// 1s, 2s, 4s, then capped at 5s; each less a jitter of up to 10%.
	uppers := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}
	evs := make([]string, 0, len(uppers))
	for i, upper := range uppers {
		res := f.reconcile("obj")
		delay := res.RequeueAfter
		if delay <= upper-upper/10 || delay > upper {
			t.Fatalf("failure %d: RequeueAfter %v, want in (%v, %v]", i+1, delay, upper-upper/10, upper)
		}
		evs = append(evs, fmt.Sprintf("Warning HandlerError Handler flaky failed, retry %d after %v: error (details in the operator's log)", i+1, delay))
		p := f.record().Handlers["flaky"]
		if p.Retries != i+1 || p.Done || p.Delayed == nil || !p.Delayed.Equal(f.clock.Now().Add(delay)) ||
			p.Message != "error (details in the operator's log)" {
			t.Fatalf("failure %d: progress %+v", i+1, p)
		}
		// Before the delay is over (e.g. an event on the object), nothing runs.
		f.clock.SetTime(f.clock.Now().Add(delay - time.Millisecond))
		if res := f.reconcile("obj"); res.RequeueAfter != time.Millisecond || fails != i+1 {
			t.Fatalf("reconcile during the backoff = %+v, ran %d times; want RequeueAfter 1ms, no run", res, fails)
		}
		f.clock.SetTime(f.clock.Now().Add(time.Millisecond))
	}
	if res := f.reconcile("obj"); res != (reconcile.Result{}) {
		t.Fatalf("reconcile after the last failure = %+v, want done", res)
	}
	p := f.record().Handlers["flaky"]
	if !p.Done || p.Retries != 4 || p.Delayed != nil || p.Message != "" {
		t.Fatalf("final progress %+v, want done after 4 retries", p)
	}
	if got := f.events(); !slices.Equal(got, evs) {
		t.Fatalf("events = %q, want %q", got, evs)
	}
}

// century is the ceiling of Backoff and MaxBackoff.
const century = 100 * 365 * 24 * time.Hour

// TestHandlersBackoffGrowsToTheCapWithoutOverflow: with a cap near time.Duration's limit,
// the delays double (less the jitter) up to the cap and stay there, 45 failures on: none
// overflows into an immediate retry.
func TestHandlersBackoffGrowsToTheCapWithoutOverflow(t *testing.T) {
	fail := lifecycle.Handler[*corev1.ConfigMap]{ID: "fail", Fn: func(context.Context, *corev1.ConfigMap) error { return errors.New("down") }}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{fail},
		lifecycle.HandlersOptions{Backoff: time.Second, MaxBackoff: math.MaxInt64}, configMap("obj"))
	var prev time.Duration
	for n := 1; n <= 45; n++ {
		delay := f.reconcile("obj").RequeueAfter
		upper := century
		if n <= 32 { // 2^32 s is over a century
			upper = time.Second << (n - 1)
		}
		if delay <= upper-upper/10 || delay > upper {
			t.Fatalf("failure %d: RequeueAfter %v, want in (%v, %v]", n, delay, upper-upper/10, upper)
		}
		if upper < century && delay <= prev {
			t.Fatalf("failure %d: RequeueAfter %v, not above the previous %v", n, delay, prev)
		}
		h := f.record().Handlers["fail"]
		if h.Retries != n || h.Delayed == nil || !h.Delayed.Equal(f.clock.Now().Add(delay)) {
			t.Fatalf("failure %d: progress %+v, want %d retries, delayed by %v", n, h, n, delay)
		}
		prev = delay
		f.clock.SetTime(*h.Delayed)
	}
}

// TestHandlersBackoffAfterManyRetries: however many retries the progress counts, and however
// large Backoff and MaxBackoff, the delay is within the jitter of the cap.
func TestHandlersBackoffAfterManyRetries(t *testing.T) {
	for _, tc := range []struct {
		backoff, maxBackoff time.Duration
		retries             int
		cap                 time.Duration
	}{
		{time.Second, 50 * 365 * 24 * time.Hour, 40, 50 * 365 * 24 * time.Hour},
		{time.Second, math.MaxInt64, 40, century},
		{time.Second, math.MaxInt64, 63, century},
		{time.Nanosecond, math.MaxInt64, 64, century},
		{time.Second, math.MaxInt64, 1000, century},
		{time.Second, math.MaxInt64, math.MaxInt32, century},
		{math.MaxInt64, 0, 0, century},
		{math.MaxInt64, math.MaxInt64, 40, century},
		{time.Second, 5 * time.Minute, 40, 5 * time.Minute},
	} {
		t.Run(fmt.Sprintf("%v-%v-%d", tc.backoff, tc.maxBackoff, tc.retries), func(t *testing.T) {
			cm := configMap("obj")
			cm.Annotations[lifecycle.DefaultProgressAnnotation] = fmt.Sprintf(`{"generation":1,"handlers":{"fail":{"retries":%d,"done":false}}}`, tc.retries)
			fail := lifecycle.Handler[*corev1.ConfigMap]{ID: "fail", Fn: func(context.Context, *corev1.ConfigMap) error { return errors.New("down") }}
			f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{fail},
				lifecycle.HandlersOptions{Backoff: tc.backoff, MaxBackoff: tc.maxBackoff}, cm)
			if delay := f.reconcile("obj").RequeueAfter; delay <= tc.cap-tc.cap/10 || delay > tc.cap {
				t.Fatalf("retry %d: RequeueAfter %v, want in (%v, %v]", tc.retries+1, delay, tc.cap-tc.cap/10, tc.cap)
			}
			if h := f.record().Handlers["fail"]; h.Retries != tc.retries+1 || h.Delayed == nil || !h.Delayed.After(f.clock.Now()) {
				t.Fatalf("progress %+v, want %d retries, delayed", h, tc.retries+1)
			}
		})
	}
}

func TestHandlersTerminalErrorFailsForGood(t *testing.T) {
	var j journal
	runs := 0
	fatal := lifecycle.Handler[*corev1.ConfigMap]{ID: "fatal", Fn: func(context.Context, *corev1.ConfigMap) error {
		runs++
		return reconcile.TerminalError(errors.New("bad spec"))
	}}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{fatal, ok(&j, "after")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne}, configMap("obj"))
	f.reconcile("obj")
	f.reconcile("obj")
	if res := f.reconcile("obj"); res != (reconcile.Result{}) || runs != 1 || strings.Join(j.all(), ",") != "after" {
		t.Fatalf("Reconcile = %+v; fatal ran %d times, others %q; want done, 1 run, after ran", res, runs, j.all())
	}
	p := f.record().Handlers["fatal"]
	if !p.Done || !p.Failed || p.Retries != 0 || p.Message != "terminal error: error (details in the operator's log)" {
		t.Fatalf("progress = %+v, want done and failed for good", p)
	}
	if evs := f.events(); len(evs) != 1 ||
		evs[0] != "Warning HandlerFailed Handler fatal failed for good: terminal error: error (details in the operator's log)" {
		t.Fatalf("events = %q", evs)
	}
}

func TestHandlersNewGenerationRunsAllAgain(t *testing.T) {
	var j journal
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.AllAtOnce}, configMap("obj"))
	f.reconcile("obj")
	f.reconcile("obj")
	cm := f.object()
	cm.Generation = 2 // what the API server does on a spec change
	if err := f.c.Update(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	f.reconcile("obj")
	if got := strings.Join(j.all(), ","); got != "a,b,a,b" {
		t.Fatalf("runs %s, want a,b,a,b", got)
	}
	if p := f.record(); p.Generation != 2 || !p.Handlers["a"].Done || !p.Handlers["b"].Done {
		t.Fatalf("progress = %+v, want generation 2 all done", p)
	}
}

func TestHandlersCorruptAnnotationStartsAfresh(t *testing.T) {
	for _, raw := range []string{"{not json", `{"generation":1,"handlers":{"a":{"retries":-1}}}`, `{"gen":1}`, `{"generation":1} trailing`, "",
		"null", `{"generation":1,"handlers":{"a":{"done":"yes"}}}`} {
		t.Run(raw, func(t *testing.T) {
			var j journal
			cm := configMap("obj")
			cm.Annotations[lifecycle.DefaultProgressAnnotation] = raw
			f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b")},
				lifecycle.HandlersOptions{Lifecycle: lifecycle.AllAtOnce}, cm)
			if res := f.reconcile("obj"); res != (reconcile.Result{}) {
				t.Fatalf("Reconcile = %+v, want done", res)
			}
			if got := strings.Join(j.all(), ","); got != "a,b" {
				t.Fatalf("runs %s, want a fresh start a,b", got)
			}
			evs := f.events()
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning ProgressCorrupt Annotation quiesce.dev/progress holds no valid progress, all handlers start afresh: ") {
				t.Fatalf("events = %q, want one ProgressCorrupt warning", evs)
			}
			if p := f.record(); !p.Handlers["a"].Done || !p.Handlers["b"].Done {
				t.Fatalf("progress = %+v, want all done", p)
			}
		})
	}
}

func TestHandlersPatchOnlyTheAnnotation(t *testing.T) {
	var j journal
	var c client.Client
	// The handler changes the object on the server (a label, an annotation) and in its own
	// copy; neither may be undone or sent by the progress patch.
	edit := lifecycle.Handler[*corev1.ConfigMap]{ID: "edit", Fn: func(ctx context.Context, cm *corev1.ConfigMap) error {
		j.add("edit")
		server := cm.DeepCopy()
		server.Labels["handler"] = "was-here"
		server.Annotations["handler.example/note"] = "hi"
		if err := c.Update(ctx, server); err != nil {
			return err
		}
		cm.Labels["local"] = "only" // the handler's own copy: never written by the reconciler
		return nil
	}}
	c = fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	f := newFixtureWith(t, c, []lifecycle.Handler[*corev1.ConfigMap]{edit, ok(&j, "b")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.AllAtOnce})
	f.reconcile("obj")
	cm := f.object()
	want := map[string]string{"app": "demo", "handler": "was-here"}
	if fmt.Sprint(cm.Labels) != fmt.Sprint(want) {
		t.Fatalf("labels = %v, want %v", cm.Labels, want)
	}
	if cm.Annotations["other.example/keep"] != "yes" || cm.Annotations["handler.example/note"] != "hi" || len(cm.Annotations) != 3 {
		t.Fatalf("annotations = %v, want the others kept beside the progress", cm.Annotations)
	}
	if p := f.record(); !p.Handlers["edit"].Done || !p.Handlers["b"].Done {
		t.Fatalf("progress = %+v", p)
	}
}

func TestHandlersStaleReadRunsNothing(t *testing.T) {
	var j journal
	var stale *corev1.ConfigMap
	base := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	// A lagging cache: Get returns the object as it was before the first reconcile.
	c := interceptor.NewClient(base, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if stale != nil {
			stale.DeepCopyInto(obj.(*corev1.ConfigMap))
			return nil
		}
		return c.Get(ctx, key, obj, opts...)
	}})
	f := newFixtureWith(t, c, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne, NextCycle: time.Millisecond})
	stale = &corev1.ConfigMap{}
	if err := base.Get(context.Background(), objKey, stale); err != nil {
		t.Fatal(err)
	}
	f.reconcile("obj") // a runs
	if res := f.reconcile("obj"); res.RequeueAfter != time.Millisecond || strings.Join(j.all(), ",") != "a" {
		t.Fatalf("reconcile on a stale read = %+v, runs %q; want a requeue and no run", res, j.all())
	}
	stale = nil // the cache caught up
	f.reconcile("obj")
	if got := strings.Join(j.all(), ","); got != "a,b" {
		t.Fatalf("runs %s, want a,b", got)
	}
}

func TestHandlersObjectNotFound(t *testing.T) {
	var j journal
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, lifecycle.HandlersOptions{})
	if res := f.reconcile("gone"); res != (reconcile.Result{}) || len(j.all()) != 0 {
		t.Fatalf("Reconcile of a missing object = %+v, runs %q", res, j.all())
	}
}

func TestHandlersLifecyclePickingANonPendingHandlerIsTerminal(t *testing.T) {
	var j journal
	bad := func([]string, map[string]lifecycle.Progress) []string { return []string{"zzz"} }
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, lifecycle.HandlersOptions{Lifecycle: bad}, configMap("obj"))
	_, err := f.r.Reconcile(context.Background(), request("obj"))
	if !errors.Is(err, reconcile.TerminalError(nil)) || !strings.Contains(err.Error(), `picked "zzz"`) || len(j.all()) != 0 {
		t.Fatalf("Reconcile = %v, runs %q; want a terminal error and no run", err, j.all())
	}
}

func TestHandlersPanicIsARetryableFailure(t *testing.T) {
	p := lifecycle.Handler[*corev1.ConfigMap]{ID: "p", Fn: func(context.Context, *corev1.ConfigMap) error { panic("kaboom") }}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{p}, lifecycle.HandlersOptions{}, configMap("obj"))
	if res := f.reconcile("obj"); res.RequeueAfter <= reconcilers.DefaultBackoff*9/10 || res.RequeueAfter > reconcilers.DefaultBackoff {
		t.Fatalf("Reconcile = %+v, want RequeueAfter %v less up to 10%%", res, reconcilers.DefaultBackoff)
	}
	if h := f.record().Handlers["p"]; h.Retries != 1 || h.Done || h.Message != "panic (details in the operator's log)" {
		t.Fatalf("progress = %+v, want 1 retry with the panic", h)
	}
}

// TestHandlersInterruptedByTheDrain: a handler cancelled by the drain is left started and
// not done, without a retry, while the outcome of one that finished before is recorded.
func TestHandlersInterruptedByTheDrain(t *testing.T) {
	var j journal
	running := make(chan struct{})
	slow := lifecycle.Handler[*corev1.ConfigMap]{ID: "slow", Fn: func(ctx context.Context, _ *corev1.ConfigMap) error {
		close(running)
		<-ctx.Done()
		return ctx.Err()
	}}
	c := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	f := &fixture{t: t, c: c, rec: events.NewFakeRecorder(10), clock: clocktesting.NewFakePassiveClock(epoch)}
	f.ex = drain.New(drain.Options{CancelAfter: 0})
	internal.Of(f.ex).Settings().Owned = true // as a runnable.Runnable does
	r, err := lifecycle.Handlers(f.ex, c, "cm", nil, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), slow, ok(&j, "c")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.AllAtOnce, Recorder: f.rec, Clock: f.clock, UnsignedProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		res reconcile.Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.Reconcile(context.Background(), request("obj"))
		done <- result{res, err}
	}()
	<-running
	if err := f.ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil {
		t.Fatalf("Reconcile = %v, want no error", got.err)
	}
	p := f.record()
	if h := p.Handlers["a"]; !h.Done {
		t.Fatalf("a = %+v, want done", h)
	}
	if h := p.Handlers["slow"]; h.Done || h.Retries != 0 || h.Started == nil || h.Message != "" || h.Delayed != nil {
		t.Fatalf("slow = %+v, want started, not done, no retry", h)
	}
	if h, ran := p.Handlers["c"]; h.Done || !slices.Equal(j.all(), []string{"a"}) {
		t.Fatalf("c = %+v (in progress: %v), runs %q; want c not run", h, ran, j.all())
	}
	if evs := f.events(); len(evs) != 0 {
		t.Fatalf("events = %q, want none for an interruption", evs)
	}
}

// TestRecordRoundTrip: the annotation's JSON is the one v0.1 wrote (reconcilers.Progress then),
// so objects annotated by it still parse and encode to the same bytes.
func TestRecordRoundTrip(t *testing.T) {
	started, delayed := epoch, epoch.Add(90*time.Second)
	p := lifecycle.Record{Generation: 7, Handlers: map[string]lifecycle.Progress{
		"b": {Retries: 2, Started: &started, Delayed: &delayed, Message: "failed to dial: \"x\""},
		"a": {Done: true, Started: &started},
		"z": {Done: true, Failed: true, Message: "terminal error: bad"},
	}}
	s, err := p.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"generation":7,"handlers":{` +
		`"a":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"},` +
		`"b":{"retries":2,"done":false,"started":"2025-01-02T03:04:05Z","delayed":"2025-01-02T03:05:35Z","message":"failed to dial: \"x\""},` +
		`"z":{"retries":0,"done":true,"failed":true,"message":"terminal error: bad"}}}`
	if s != want {
		t.Fatalf("Encode =\n%s\nwant\n%s", s, want)
	}
	back, err := lifecycle.ParseRecord(s)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := back.Encode()
	if again != s || back.Generation != 7 || !back.Handlers["b"].Delayed.Equal(delayed) {
		t.Fatalf("round trip = %+v (%s)", back, again)
	}
	for _, bad := range []string{"", "null", "null x", "[]", "{}", `{"gen":1}`, `{"generation":null}`, `{"generation":"1"}`,
		`{"generation":1}}`, `{"generation":1} {}`, `{"generation":1,"handlers":[]}`, `{"generation":1,"handlers":{"a":{"retries":"2"}}}`,
		`{"generation":1,"handlers":{"a":{"retries":-2}}}`} {
		if _, err := lifecycle.ParseRecord(bad); err == nil {
			t.Errorf("ParseRecord(%q) = nil error", bad)
		}
	}
}

// TestRecordToleratesUnknownFields: a Record written by a newer version, with fields this
// one does not know, is read, not taken for corruption.
func TestRecordToleratesUnknownFields(t *testing.T) {
	p, err := lifecycle.ParseRecord(`{"generation":3,"schema":2,"handlers":{` +
		`"a":{"retries":1,"done":true,"started":"2025-01-02T03:04:05Z","attempts":[1,2],"took":"2s"},` +
		`"b":{"retries":2,"done":false,"message":"failed to dial","cause":{"code":503}}},"owner":"v2"}`)
	if err != nil {
		t.Fatalf("ParseRecord = %v, want unknown fields ignored", err)
	}
	a, b := p.Handlers["a"], p.Handlers["b"]
	if p.Generation != 3 || len(p.Handlers) != 2 || !a.Done || a.Retries != 1 || a.Started == nil || !a.Started.Equal(epoch) ||
		b.Done || b.Retries != 2 || b.Message != "failed to dial" {
		t.Fatalf("ParseRecord = %+v", p)
	}
}

// TestHandlersKeepProgressWithUnknownFields: after a rollback to an older version, the
// progress a newer one wrote still counts: done handlers do not run again.
func TestHandlersKeepProgressWithUnknownFields(t *testing.T) {
	var j journal
	cm := configMap("obj")
	cm.Annotations[lifecycle.DefaultProgressAnnotation] = `{"generation":1,"schema":2,"handlers":{"a":{"retries":0,"done":true,"took":"2s"}}}`
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.AllAtOnce}, cm)
	if res := f.reconcile("obj"); res != (reconcile.Result{}) {
		t.Fatalf("Reconcile = %+v, want done", res)
	}
	if got := strings.Join(j.all(), ","); got != "b" {
		t.Fatalf("runs %s, want only b", got)
	}
	if evs := f.events(); len(evs) != 0 {
		t.Fatalf("events = %q, want none", evs)
	}
	if p := f.record(); !p.Handlers["a"].Done || !p.Handlers["b"].Done {
		t.Fatalf("progress = %+v, want all done", p)
	}
}

// TestHandlersShutdownBeforeAnyHandlerStartedIsQuiet: a reconcile stopped by the drain
// before it started a handler records nothing, runs nothing, and returns no error.
func TestHandlersShutdownBeforeAnyHandlerStartedIsQuiet(t *testing.T) {
	var j journal
	var f *fixture
	var once sync.Once
	drainErr := make(chan error, 1)
	base := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	c := interceptor.NewClient(base, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		// The shutdown arrives while the object is read; CancelAfter 0 cancels at once.
		once.Do(func() {
			go func() { drainErr <- f.ex.Drain(context.Background()) }()
			<-f.ex.Draining()
			<-ctx.Done()
		})
		return nil
	}})
	f = newFixtureWith(t, c, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, lifecycle.HandlersOptions{NextCycle: time.Millisecond})
	internal.Of(f.ex).Settings().Owned = true
	res, err := f.r.Reconcile(context.Background(), request("obj"))
	if err != nil || res.RequeueAfter != time.Millisecond || len(j.all()) != 0 {
		t.Fatalf("Reconcile = %+v, %v, runs %q; want a requeue, no error, no run", res, err, j.all())
	}
	if err := <-drainErr; err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := base.Get(context.Background(), objKey, &cm); err != nil {
		t.Fatal(err)
	}
	if _, ok := cm.Annotations[lifecycle.DefaultProgressAnnotation]; ok {
		t.Fatal("progress recorded for a reconcile stopped before it started a handler")
	}
}

func TestHandlersNewObjReturningNilIsTerminal(t *testing.T) {
	ex := drain.New(drain.Options{})
	drained(t, ex)
	r, err := lifecycle.Handlers(ex, fake.NewClientBuilder().Build(), "cm", func() *corev1.ConfigMap { return nil },
		[]lifecycle.Handler[*corev1.ConfigMap]{{ID: "a", Fn: func(context.Context, *corev1.ConfigMap) error { return nil }}},
		lifecycle.HandlersOptions{UnsignedProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(context.Background(), request("obj")); !errors.Is(err, reconcile.TerminalError(nil)) {
		t.Fatalf("Reconcile = %v, want a terminal error", err)
	}
}

// annotationLimits is a client that, as the API server does, rejects a patch that leaves the
// object's annotations over their total limit of 256 KiB.
func annotationLimits(objs ...client.Object) client.Client {
	return interceptor.NewClient(fake.NewClientBuilder().WithObjects(objs...).Build(), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if errs := apivalidation.ValidateAnnotations(obj.GetAnnotations(), field.NewPath("metadata", "annotations")); len(errs) > 0 {
				return apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, obj.GetName(), errs)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
}

// TestHandlersTruncateLongErrors: a handler's 300 KiB error is stored cut to 1 KiB, so the
// progress patch stays far below the API server's limit on annotations, and the Event's note
// within the 1 KiB the API server accepts.
func TestHandlersTruncateLongErrors(t *testing.T) {
	huge := "failed to apply: " + strings.Repeat("x", 300<<10)

	// The client rejects what a whole message made: a 307 KB annotation.
	c := annotationLimits(configMap("probe"))
	whole := configMap("probe")
	whole.Annotations[lifecycle.DefaultProgressAnnotation] = huge
	if err := c.Patch(context.Background(), whole, client.MergeFrom(configMap("probe"))); !apierrors.IsInvalid(err) {
		t.Fatalf("Patch of a %d-byte annotation = %v, want Invalid", len(huge), err)
	}

	for _, tc := range []struct {
		name, event string
		err         error
	}{
		{"retryable", "Warning HandlerError ", errors.New(huge)},
		{"terminal", "Warning HandlerFailed ", reconcile.TerminalError(errors.New(huge))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			big := lifecycle.Handler[*corev1.ConfigMap]{ID: "big", Fn: func(context.Context, *corev1.ConfigMap) error { return tc.err }}
			f := newFixtureWith(t, annotationLimits(configMap("obj")), []lifecycle.Handler[*corev1.ConfigMap]{big},
				lifecycle.HandlersOptions{PublishErrors: true})
			f.reconcile("obj") // fails the test if the progress patch fails

			if ann := f.object().Annotations[lifecycle.DefaultProgressAnnotation]; len(ann) > 1200 {
				t.Fatalf("progress annotation of %d bytes, want at most 1200", len(ann))
			}
			msg := f.record().Handlers["big"].Message
			want := tc.err.Error()[:1024-len("... (truncated)")] + "... (truncated)"
			if msg != want {
				t.Fatalf("stored message of %d bytes = %.40q...%q, want the first %d bytes of the error and a mark",
					len(msg), msg, msg[max(0, len(msg)-20):], len(want))
			}
			evs := f.events()
			if len(evs) != 1 || !strings.HasPrefix(evs[0], tc.event) || len(evs[0]) > len(tc.event)+1024 ||
				!strings.HasSuffix(evs[0], "... (truncated)") {
				t.Fatalf("events %.200q, want one with a note of at most 1 KiB", evs)
			}
		})
	}
}

// TestHandlersTruncateOnARuneBoundary: a long message is cut between UTF-8 characters, never
// inside one.
func TestHandlersTruncateOnARuneBoundary(t *testing.T) {
	for _, r := range []string{"é", "世", "😀"} {
		t.Run(r, func(t *testing.T) {
			text := strings.Repeat(r, 2000)
			bad := lifecycle.Handler[*corev1.ConfigMap]{ID: "bad", Fn: func(context.Context, *corev1.ConfigMap) error { return errors.New(text) }}
			f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{bad}, lifecycle.HandlersOptions{PublishErrors: true}, configMap("obj"))
			f.reconcile("obj")
			msg := f.record().Handlers["bad"].Message
			kept, found := strings.CutSuffix(msg, "... (truncated)")
			if !found || !utf8.ValidString(msg) || len(msg) > 1024 || len(msg) <= 1024-len(r) || !strings.HasPrefix(text, kept) {
				t.Fatalf("stored message of %d bytes (valid UTF-8: %v) ending %q, want at most 1024, whole characters, marked",
					len(msg), utf8.ValidString(msg), msg[max(0, len(msg)-24):])
			}
		})
	}
}

// TestHandlersTypedNilPlugins: a typed-nil Recorder or Clock is treated as nil (no Events,
// the real clock), as every quiesce Options treats its plug-ins: a failing handler is
// recorded, not a panic of the reconcile. A typed-nil client is refused at setup.
func TestHandlersTypedNilPlugins(t *testing.T) {
	failing := lifecycle.Handler[*corev1.ConfigMap]{ID: "flaky", Fn: func(context.Context, *corev1.ConfigMap) error {
		return errors.New("try again")
	}}
	c := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	ex := drain.New(drain.Options{})
	drained(t, ex)
	r, err := lifecycle.Handlers(ex, c, "cm", nil, []lifecycle.Handler[*corev1.ConfigMap]{failing},
		lifecycle.HandlersOptions{UnsignedProgress: true, Recorder: (*events.FakeRecorder)(nil), Clock: (*clocktesting.FakePassiveClock)(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(context.Background(), request("obj")); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), objKey, &cm); err != nil {
		t.Fatal(err)
	}
	rec, err := lifecycle.ParseRecord(cm.Annotations[lifecycle.DefaultProgressAnnotation])
	if p := rec.Handlers["flaky"]; err != nil || p.Retries != 1 || p.Done {
		t.Fatalf("record = %+v, %v; want the failure recorded, to retry", rec, err)
	}

	var nilClient client.Client = (*typedNilClient)(nil)
	if _, err := lifecycle.Handlers(ex, nilClient, "cm", nil, []lifecycle.Handler[*corev1.ConfigMap]{failing},
		lifecycle.HandlersOptions{}); !errors.Is(err, lifecycle.ErrInvalidHandlers) || !strings.Contains(err.Error(), "nil client") {
		t.Errorf("Handlers(typed-nil client) = %v, want the nil client refused", err)
	}
}

// typedNilClient is a client.Client whose nil pointer a caller may pass by mistake.
type typedNilClient struct{ client.Client }

// conflicts counts the progress patches that the client refused with a conflict.
type conflicts struct {
	mu sync.Mutex
	n  int
}

// counting wraps c so that the conflicts of its patches are counted; before, if set, sees
// each patch (counted from 1) before it is sent, and fails it by returning an error.
func (cf *conflicts) counting(c client.WithWatch, before func(ctx context.Context, n int) error) client.WithWatch {
	patches := 0
	return interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches++
			if before != nil {
				if err := before(ctx, patches); err != nil {
					return err
				}
			}
			err := c.Patch(ctx, obj, patch, opts...)
			if apierrors.IsConflict(err) {
				cf.mu.Lock()
				cf.n++
				cf.mu.Unlock()
			}
			return err
		},
	})
}

// TestHandlersSaveIsOptimistic: the patch that records a cycle's outcomes carries the
// resourceVersion. A handler that changed the object itself (a conflict, the annotation as
// the cycle's start left it) still has its outcome recorded, on the object read anew; progress
// that someone else recorded meanwhile (a new leader) is never overwritten: the cycle's
// outcomes are dropped, quietly, and the object reconciled again.
func TestHandlersSaveIsOptimistic(t *testing.T) {
	const theirs = `{"generation":1,"handlers":{"a":{"retries":0,"done":false},"b":{"retries":0,"done":true}}}`
	for _, tc := range []struct {
		name       string
		annotation string // what the handler writes beside its label; "" for none
	}{
		{"the handler changed the object", ""},
		{"someone recorded progress meanwhile", theirs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cf conflicts
			var c client.Client
			edit := lifecycle.Handler[*corev1.ConfigMap]{ID: "a", Fn: func(ctx context.Context, cm *corev1.ConfigMap) error {
				server := cm.DeepCopy()
				server.Labels["handler"] = "saved"
				if tc.annotation != "" {
					server.Annotations[lifecycle.DefaultProgressAnnotation] = tc.annotation
				}
				return c.Update(ctx, server)
			}}
			c = cf.counting(fake.NewClientBuilder().WithObjects(configMap("obj")).Build(), nil)
			f := newFixtureWith(t, c, []lifecycle.Handler[*corev1.ConfigMap]{edit},
				lifecycle.HandlersOptions{NextCycle: time.Minute})
			var lines []string
			logger := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{Verbosity: 1})
			res, err := f.r.Reconcile(log.IntoContext(context.Background(), logger), request("obj"))
			if err != nil || cf.n != 1 {
				t.Fatalf("Reconcile = %+v, %v, with %d conflicts; want no error after 1 conflict", res, err, cf.n)
			}
			got := f.object().Annotations[lifecycle.DefaultProgressAnnotation]
			if tc.annotation != "" {
				if got != theirs || res.RequeueAfter != time.Minute {
					t.Fatalf("progress %s, result %+v; want theirs kept and a requeue after NextCycle", got, res)
				}
				if !strings.Contains(strings.Join(lines, "\n"), "The progress changed since the cycle started") {
					t.Fatalf("log lacks the dropped outcomes:\n%s", strings.Join(lines, "\n"))
				}
				return
			}
			if p := f.record(); !p.Handlers["a"].Done || res != (reconcile.Result{}) {
				t.Fatalf("progress %s, result %+v; want a done, recorded on the object read anew", got, res)
			}
		})
	}
}

// TestHandlersSaveEndsWithTheFence: the save of a cycle's outcomes outlives the drain's
// cancellation, not the fence. A patch in flight when the lease is lost ends at once with
// the fence's cause, and none is sent once it was lost (here, the retry after a conflict):
// the replica that lost the lease writes nothing more, and says so.
func TestHandlersSaveEndsWithTheFence(t *testing.T) {
	leaseLost := errors.New("leader election lost")
	for _, tc := range []struct {
		name     string
		inFlight bool // the server hangs on the save's patch until the fence; else it refuses it
	}{
		{"fenced during the save's patch", true},
		{"fenced, then a conflict", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cf conflicts
			var ex *drain.Executor
			saveEnded := make(chan error, 1)
			patches := 0
			base := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
			c := cf.counting(base, func(ctx context.Context, n int) error {
				patches = n
				if n != 2 { // 1: the cycle's start; 2: the save
					return nil
				}
				internal.CoreOf(ex).Fence(leaseLost)
				if !tc.inFlight {
					return apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "obj", errors.New("changed"))
				}
				<-ctx.Done()
				saveEnded <- context.Cause(ctx)
				return ctx.Err()
			})
			f := newFixtureWith(t, c, []lifecycle.Handler[*corev1.ConfigMap]{ok(&journal{}, "a")},
				lifecycle.HandlersOptions{NextCycle: time.Minute})
			ex = f.ex
			var lines []string
			logger := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{})
			if _, err := f.r.Reconcile(log.IntoContext(context.Background(), logger), request("obj")); err != nil {
				t.Fatalf("Reconcile = %v, want no error", err)
			}
			// The fence ends the reconcile's call: Reconcile may return at once, while the
			// cycle, still tracked, ends its save. The drain waits for it.
			if err := f.ex.Drain(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tc.inFlight {
				if cause := <-saveEnded; !errors.Is(cause, leaseLost) {
					t.Fatalf("the save's patch ended with %v, want the fence's cause", cause)
				}
			}
			if patches != 2 {
				t.Fatalf("%d patches sent, want 2: none after the fence", patches)
			}
			if p := f.record(); p.Handlers["a"].Done || p.Handlers["a"].Started == nil {
				t.Fatalf("progress %+v; want a as the cycle's start left it: started, not done", p)
			}
			if !strings.Contains(strings.Join(lines, "\n"), "Leadership lost: not recording the outcomes") {
				t.Fatalf("log lacks the fenced save:\n%s", strings.Join(lines, "\n"))
			}
		})
	}
}
