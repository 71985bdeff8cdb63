package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal/metricstest"
	"github.com/quiesce-dev/quiesce/lifecycle"
)

var configMaps = schema.GroupResource{Resource: "configmaps"}

// controllers numbers the controllers of the tests that read the process-wide metric, so that
// each reads its own series, however many times the test runs (-count).
var controllers atomic.Int64

func uniqueController(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, controllers.Add(1))
}

// saveFailures returns quiesce_progress_save_failures_total{controller, reason} as
// controller-runtime's registry serves it; 0 if it has no such series.
func saveFailures(t *testing.T, controller, reason string) float64 {
	t.Helper()
	return metricstest.Value(t, "quiesce_progress_save_failures_total", map[string]string{"controller": controller, "reason": reason})
}

// fill adds to obj's annotations one of someone else's that brings their total to 10 bytes
// under the API server's limit, as a user who may edit the object can.
func fill(obj client.Object) {
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	const key = "fill.example/data"
	size := len(key)
	for k, v := range ann {
		size += len(k) + len(v)
	}
	ann[key] = strings.Repeat("x", apivalidation.TotalAnnotationSizeLimitB-size-10)
	obj.SetAnnotations(ann)
}

// validated wraps c so that, as the API server does, a write (a patch, or a patch of the
// status) that leaves the object's annotations over their limit is refused as Invalid.
func validated(c client.WithWatch) client.WithWatch {
	check := func(obj client.Object) error {
		if errs := apivalidation.ValidateAnnotations(obj.GetAnnotations(), field.NewPath("metadata", "annotations")); len(errs) > 0 {
			return apierrors.NewInvalid(obj.GetObjectKind().GroupVersionKind().GroupKind(), obj.GetName(), errs)
		}
		return nil
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := check(obj); err != nil {
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := check(obj); err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
}

// TestHandlersReportProgressNotSaved: a progress patch that fails (here because someone
// filled the object's annotations to just under the API server's limit, or for any other
// reason) is reported on the object by a Warning Event saying why, and counted by
// quiesce_progress_save_failures_total; the reconcile fails, for controller-runtime to log
// and back off. Before, it failed with no Event and no metric: no handler ran, silently.
func TestHandlersReportProgressNotSaved(t *testing.T) {
	gr := configMaps
	refuse := func(err error) func(client.WithWatch) client.WithWatch {
		return func(c client.WithWatch) client.WithWatch {
			return interceptor.NewClient(c, interceptor.Funcs{
				Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
					return err
				},
			})
		}
	}
	for _, tc := range []struct {
		name, reason, why string
		client            func(client.WithWatch) client.WithWatch
		filled            bool
	}{
		{"annotations filled", "too_large", "the object is too large (its annotations reach the API server's limit", validated, true},
		{"invalid", "invalid", "the API server refused it as invalid: Invalid (HTTP 422)", refuse(apierrors.NewInvalid(
			schema.GroupKind{Kind: "ConfigMap"}, "obj", field.ErrorList{field.Invalid(field.NewPath("metadata"), "", "no")})), false},
		{"forbidden", "forbidden", "the operator may not patch it: Forbidden (HTTP 403)",
			refuse(apierrors.NewForbidden(gr, "obj", errors.New("no"))), false},
		{"server error", "error", "ServerTimeout (HTTP 500)", refuse(apierrors.NewServerTimeout(gr, "patch", 1)), false},
		// As kube-apiserver passes etcd's refusal on: an internal error with etcd's text.
		{"etcd too large", "too_large", "the object is too large for the API server's storage (" + cmJSONSize + " bytes as JSON; " +
			"anyone who may write it can grow it, with labels for one)", refuse(&apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusInternalServerError, Message: "etcdserver: request is too large"}}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			cm := configMap("obj")
			if tc.filled {
				fill(cm)
			}
			controller := uniqueController("notsaved-" + tc.reason)
			f := newNamedFixture(t, tc.client(fake.NewClientBuilder().WithObjects(cm).Build()), controller,
				[]lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, lifecycle.HandlersOptions{})
			for i := 1; i <= 2; i++ {
				_, err := f.r.Reconcile(context.Background(), request("obj"))
				if err == nil || !strings.Contains(err.Error(), "failed to save progress in annotation quiesce.dev/progress ("+tc.reason+")") {
					t.Fatalf("Reconcile %d = %v, want the progress not saved (%s)", i, err, tc.reason)
				}
				evs := f.events()
				want := "Warning " + lifecycle.ReasonProgressNotSaved + " Progress of the handlers not saved in annotation " +
					"quiesce.dev/progress, no handler runs until it is: " + tc.why
				if len(evs) != 1 || !strings.HasPrefix(evs[0], want) {
					t.Fatalf("events after reconcile %d = %.300q, want one starting %q", i, evs, want)
				}
				if got := saveFailures(t, controller, tc.reason); got != float64(i) {
					t.Fatalf("quiesce_progress_save_failures_total{controller=%q,reason=%q} = %v after %d reconciles, want %d",
						controller, tc.reason, got, i, i)
				}
			}
			if runs := j.all(); len(runs) != 0 {
				t.Fatalf("runs %q, want none: no handler runs before its start is recorded", runs)
			}
		})
	}
}

// cmJSONSize is the size of configMap("obj") as the fake client returns it, encoded in JSON.
var cmJSONSize = func() string {
	c := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	var cm corev1.ConfigMap
	if err := c.Get(context.Background(), objKey, &cm); err != nil {
		panic(err)
	}
	b, err := json.Marshal(&cm)
	if err != nil {
		panic(err)
	}
	return strconv.Itoa(len(b))
}()

// TestHandlersReportConflictsThatKeepComing: a progress patch that conflicts is the optimistic
// lock at work (a stale read) and requeues the object quietly; ConflictsToReport cycles of an
// object in a row that conflict mean that someone changes it faster than the operator reads and
// patches it: reported (Event, metric) and a reconcile error, at each cycle until one saves.
// Before, every cycle requeued quietly, for ever.
func TestHandlersReportConflictsThatKeepComing(t *testing.T) {
	controller := uniqueController("conflicts")
	conflict := true
	c := interceptor.NewClient(fake.NewClientBuilder().WithObjects(configMap("obj")).Build(), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if conflict {
				return apierrors.NewConflict(configMaps, obj.GetName(), errors.New("changed"))
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	var j journal
	f := newNamedFixture(t, c, controller, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b")},
		lifecycle.HandlersOptions{Lifecycle: lifecycle.OneByOne, NextCycle: time.Minute})
	quiet := func(n int, reports float64) {
		t.Helper()
		for i := range n {
			res, err := f.r.Reconcile(context.Background(), request("obj"))
			if err != nil || res.RequeueAfter != time.Minute {
				t.Fatalf("conflicted cycle %d = %+v, %v; want a quiet requeue after NextCycle", i+1, res, err)
			}
		}
		if evs, got := f.events(), saveFailures(t, controller, "conflict"); len(evs) != 0 || got != reports {
			t.Fatalf("events %q, metric %v after %d conflicts; want no Event, the metric at %v", evs, got, n, reports)
		}
	}
	// One note for every report, the count in the error alone: client-go's recorder folds
	// Events of the same note into a series.
	const note = "Warning " + lifecycle.ReasonProgressNotSaved + " Progress of the handlers not saved in annotation " +
		"quiesce.dev/progress, no handler runs until it is: the object changed before each of 5 or more patches in a row " +
		"(someone updates it faster than the operator reads and patches it)"
	inRow := lifecycle.ConflictsToReport
	reported := func(want float64) {
		t.Helper()
		_, err := f.r.Reconcile(context.Background(), request("obj"))
		wantErr := fmt.Sprintf("failed to save progress in annotation quiesce.dev/progress (conflict, %d cycles in a row)", inRow)
		if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Reconcile = %v, want the conflict reported as an error saying %q", err, wantErr)
		}
		inRow++
		if evs := f.events(); len(evs) != 1 || evs[0] != note {
			t.Fatalf("events = %q, want one: %q", evs, note)
		}
		if got := saveFailures(t, controller, "conflict"); got != want {
			t.Fatalf("quiesce_progress_save_failures_total{reason=conflict} = %v, want %v", got, want)
		}
	}

	quiet(lifecycle.ConflictsToReport-1, 0)
	reported(1)
	reported(2)

	conflict = false // a cycle saves: a runs, and the count starts again
	inRow = lifecycle.ConflictsToReport
	f.reconcile("obj")
	if runs := j.all(); len(runs) != 1 || runs[0] != "a" {
		t.Fatalf("runs %q, want a", runs)
	}
	conflict = true
	quiet(lifecycle.ConflictsToReport-1, 2)
	reported(3)
	if runs := j.all(); len(runs) != 1 {
		t.Fatalf("runs %q, want only a: nothing runs while the start is not recorded", runs)
	}
}

// progressField is the status field of the tests' Widgets that keeps the Record.
const progressField = "progress"

var widgetGVK = schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}

func newWidget() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(widgetGVK)
	return u
}

// TestHandlersStatusStore: with StatusField, the Record is written to the status subresource
// and read from there, never from an annotation: annotations filled to the API server's limit
// do not keep it from being saved, and a Record written into the progress annotation by a user
// who may edit the object is not read.
func TestHandlersStatusStore(t *testing.T) {
	w := newWidget()
	w.SetNamespace("ns")
	w.SetName("obj")
	w.SetGeneration(1)
	w.SetUID("uid-w")
	w.SetAnnotations(map[string]string{
		// Marks a done for generation 1; not read, wherever the Record is kept.
		lifecycle.DefaultProgressAnnotation: `{"generation":1,"handlers":{"a":{"retries":0,"done":true}}}`,
	})
	fill(w)
	base := fake.NewClientBuilder().WithObjects(w).WithStatusSubresource(w).Build()
	c := validated(base)
	ex := drain.New(drain.Options{})
	drained(t, ex)
	rec := events.NewFakeRecorder(10)
	var j journal
	run := func(id string) lifecycle.Handler[*unstructured.Unstructured] {
		return lifecycle.Handler[*unstructured.Unstructured]{ID: id, Fn: func(context.Context, *unstructured.Unstructured) error {
			j.add(id)
			return nil
		}}
	}
	r, err := lifecycle.Handlers(ex, c, "widgets", newWidget, []lifecycle.Handler[*unstructured.Unstructured]{run("a"), run("b")},
		lifecycle.HandlersOptions{StatusField: "quiesce.progress", ProgressKey: key, Recorder: rec, Lifecycle: lifecycle.OneByOne,
			Clock: clocktesting.NewFakePassiveClock(epoch)})
	if err != nil {
		t.Fatal(err)
	}
	get := func() *unstructured.Unstructured {
		t.Helper()
		got := newWidget()
		if err := base.Get(context.Background(), objKey, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for range 3 {
		if _, err := r.Reconcile(context.Background(), request("obj")); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	if runs := j.all(); !slices.Equal(runs, []string{"a", "b"}) {
		t.Fatalf("runs %q, want a, b: the annotation's Record not read, the status' one saved and read", runs)
	}
	got := get()
	raw, found, err := unstructured.NestedString(got.Object, "status", "quiesce", "progress")
	if err != nil || !found || !strings.Contains(raw, `"mac":"v2:`) {
		t.Fatalf(".status.quiesce.progress = %q (found %v, %v), want a signed Record", raw, found, err)
	}
	if p, err := lifecycle.ParseRecord(raw); err != nil || !p.Handlers["a"].Done || !p.Handlers["b"].Done {
		t.Fatalf("Record %+v, %v; want a and b done", p, err)
	}
	if ann := got.GetAnnotations()[lifecycle.DefaultProgressAnnotation]; ann != w.GetAnnotations()[lifecycle.DefaultProgressAnnotation] {
		t.Fatalf("progress annotation = %q, want it as the user left it", ann)
	}
	select {
	case e := <-rec.Events:
		t.Fatalf("event %q, want none", e)
	default:
	}
}

// TestHandlersStatusFieldRefusedWith: StatusField is checked at setup.
func TestHandlersStatusFieldRefusedWith(t *testing.T) {
	ex := drain.New(drain.Options{})
	c := fake.NewClientBuilder().Build()
	hs := []lifecycle.Handler[*unstructured.Unstructured]{{ID: "a", Fn: func(context.Context, *unstructured.Unstructured) error { return nil }}}
	for _, tc := range []struct {
		name, want string
		opts       lifecycle.HandlersOptions
	}{
		{"an annotation too", "both HandlersOptions.Annotation and StatusField are set",
			lifecycle.HandlersOptions{StatusField: progressField, Annotation: "example.com/widget-progress", UnsignedProgress: true}},
		{"an empty field name", `HandlersOptions.StatusField "quiesce..progress" has an empty field name`,
			lifecycle.HandlersOptions{StatusField: "quiesce..progress", UnsignedProgress: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lifecycle.Handlers(ex, c, "widgets", newWidget, hs, tc.opts)
			if !errors.Is(err, lifecycle.ErrInvalidHandlers) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Handlers = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestHandlersStatusFieldDropped: a status field that the API server does not keep (the CRD's
// schema prunes it, or the Go type lacks it) is reported at the first cycle, and the reconcile
// fails for good; before, every cycle would have run every handler again, silently.
func TestHandlersStatusFieldDropped(t *testing.T) {
	w := newWidget()
	w.SetNamespace("ns")
	w.SetName("obj")
	w.SetGeneration(1)
	pruning := interceptor.NewClient(fake.NewClientBuilder().WithObjects(w).WithStatusSubresource(w).Build(), interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := c.SubResource(sub).Patch(ctx, obj, patch, opts...); err != nil {
				return err
			}
			unstructured.RemoveNestedField(obj.(*unstructured.Unstructured).Object, "status", progressField)
			return nil
		},
	})
	ex := drain.New(drain.Options{})
	drained(t, ex)
	rec := events.NewFakeRecorder(10)
	var j journal
	h := lifecycle.Handler[*unstructured.Unstructured]{ID: "a", Fn: func(context.Context, *unstructured.Unstructured) error {
		j.add("a")
		return nil
	}}
	controller := uniqueController("widgets-pruned")
	r, err := lifecycle.Handlers(ex, pruning, controller, newWidget, []lifecycle.Handler[*unstructured.Unstructured]{h},
		lifecycle.HandlersOptions{StatusField: progressField, UnsignedProgress: true, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Reconcile(context.Background(), request("obj"))
	if !errors.Is(err, reconcile.TerminalError(nil)) || !strings.Contains(err.Error(), "add it, a string, to the CRD's schema") {
		t.Fatalf("Reconcile = %v, want a terminal error naming the fix", err)
	}
	want := "Warning ProgressNotSaved Progress of the handlers not saved in status field .status.progress, " +
		"no handler runs until it is: the object has no status field .status.progress (a string) to keep it in"
	if e := <-rec.Events; e != want {
		t.Fatalf("event %q, want %q", e, want)
	}
	if got := saveFailures(t, controller, "invalid"); got != 1 || len(j.all()) != 0 {
		t.Fatalf("metric %v, runs %q; want 1 and none", got, j.all())
	}
}

// TestHandlersStatusFieldNotAString: a status field that holds something else than a string
// is a corrupt Record: reported, every handler runs, and the Record replaces it.
func TestHandlersStatusFieldNotAString(t *testing.T) {
	w := newWidget()
	w.SetNamespace("ns")
	w.SetName("obj")
	w.SetGeneration(1)
	if err := unstructured.SetNestedField(w.Object, int64(42), "status", progressField); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithObjects(w).WithStatusSubresource(w).Build()
	ex := drain.New(drain.Options{})
	drained(t, ex)
	rec := events.NewFakeRecorder(10)
	var j journal
	h := lifecycle.Handler[*unstructured.Unstructured]{ID: "a", Fn: func(context.Context, *unstructured.Unstructured) error {
		j.add("a")
		return nil
	}}
	r, err := lifecycle.Handlers(ex, c, "widgets-corrupt", newWidget, []lifecycle.Handler[*unstructured.Unstructured]{h},
		lifecycle.HandlersOptions{StatusField: progressField, UnsignedProgress: true, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(context.Background(), request("obj")); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	want := "Warning ProgressCorrupt Status field .status.progress holds no valid progress, all handlers start afresh: " +
		"failed to decode progress: status field .status.progress is a int64, not a string"
	if e := <-rec.Events; e != want || len(j.all()) != 1 {
		t.Fatalf("event %q, runs %q; want %q and a run", e, j.all(), want)
	}
	got := newWidget()
	if err := c.Get(context.Background(), objKey, got); err != nil {
		t.Fatal(err)
	}
	raw, _, _ := unstructured.NestedString(got.Object, "status", progressField)
	if p, err := lifecycle.ParseRecord(raw); err != nil || !p.Handlers["a"].Done {
		t.Fatalf("Record %q (%v), want a done", raw, err)
	}
}

// TestHandlersReportOutcomesNotSaved: the patch that records the outcomes, after the handlers
// ran, is reported like the one that marks them started when it fails (here the annotations
// were filled while the handler ran, and its failure, with a retry time and a message, no
// longer fits).
func TestHandlersReportOutcomesNotSaved(t *testing.T) {
	controller := uniqueController("outcomes-notsaved")
	base := fake.NewClientBuilder().WithObjects(configMap("obj")).Build()
	c := validated(base)
	var j journal
	filling := lifecycle.Handler[*corev1.ConfigMap]{ID: "a", Fn: func(ctx context.Context, cm *corev1.ConfigMap) error {
		j.add("a")
		server := cm.DeepCopy()
		fill(server)
		if err := base.Update(ctx, server); err != nil {
			return err
		}
		return errors.New("try again")
	}}
	f := newNamedFixture(t, c, controller, []lifecycle.Handler[*corev1.ConfigMap]{filling}, lifecycle.HandlersOptions{})
	_, err := f.r.Reconcile(context.Background(), request("obj"))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "failed to save progress in annotation quiesce.dev/progress (too_large)") {
		t.Fatalf("Reconcile = %v, want the outcomes not saved (too_large)", err)
	}
	evs := f.events()
	if len(evs) != 2 || !strings.HasPrefix(evs[0], "Warning "+lifecycle.ReasonHandlerError+" ") ||
		!strings.HasPrefix(evs[1], "Warning "+lifecycle.ReasonProgressNotSaved+" ") {
		t.Fatalf("events = %q, want %s, then %s", evs, lifecycle.ReasonHandlerError, lifecycle.ReasonProgressNotSaved)
	}
	if got := saveFailures(t, controller, "too_large"); got != 1 || len(j.all()) != 1 {
		t.Fatalf("metric %v, runs %q; want 1 and a run", got, j.all())
	}
}

// TestHandlersStatusSubresourceMissing: a status patch that gets a 404 while a live read finds
// the object means that its kind has no status subresource: reported (a terminal error naming
// the kind, the Event, the metric, reason invalid), not read as a deleted object, which it was
// before (no Event, metric or error, for good). A 404 for an object the live read does not
// find either (deleted meanwhile, though a cache still has it) stays quiet.
func TestHandlersStatusSubresourceMissing(t *testing.T) {
	w := newWidget()
	w.SetNamespace("ns")
	w.SetName("obj")
	w.SetGeneration(1)
	hs := func(j *journal) []lifecycle.Handler[*unstructured.Unstructured] {
		return []lifecycle.Handler[*unstructured.Unstructured]{{ID: "a", Fn: func(context.Context, *unstructured.Unstructured) error {
			j.add("a")
			return nil
		}}}
	}
	reconciler := func(t *testing.T, controller string, live client.Reader, rec *events.FakeRecorder, j *journal) reconcile.Reconciler {
		t.Helper()
		ex := drain.New(drain.Options{})
		drained(t, ex)
		// No WithStatusSubresource: the fake client answers a status patch with a 404.
		c := fake.NewClientBuilder().WithObjects(w.DeepCopy()).Build()
		r, err := lifecycle.Handlers(ex, c, controller, newWidget, hs(j),
			lifecycle.HandlersOptions{StatusField: progressField, UnsignedProgress: true, Recorder: rec, APIReader: live})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("object there", func(t *testing.T) {
		controller := uniqueController("widgets-nostatus")
		rec := events.NewFakeRecorder(10)
		var j journal
		r := reconciler(t, controller, nil, rec, &j)
		for i := 1; i <= 2; i++ {
			_, err := r.Reconcile(context.Background(), request("obj"))
			if !errors.Is(err, reconcile.TerminalError(nil)) || apierrors.IsNotFound(err) ||
				!strings.Contains(err.Error(), "(invalid)") || !strings.Contains(err.Error(), "Widget.example.com has no /status subresource") {
				t.Fatalf("Reconcile %d = %v, want a terminal error naming the missing subresource", i, err)
			}
			want := "Warning ProgressNotSaved Progress of the handlers not saved in status field .status.progress, " +
				"no handler runs until it is: the kind Widget.example.com has no status subresource to keep it in"
			select {
			case e := <-rec.Events:
				if e != want {
					t.Fatalf("event %q, want %q", e, want)
				}
			default:
				t.Fatalf("no event after reconcile %d, want %q", i, want)
			}
			if got := saveFailures(t, controller, "invalid"); got != float64(i) || len(j.all()) != 0 {
				t.Fatalf("metric %v, runs %q after %d reconciles; want %d and none", got, j.all(), i, i)
			}
		}
	})

	t.Run("object deleted", func(t *testing.T) {
		controller := uniqueController("widgets-deleted")
		rec := events.NewFakeRecorder(10)
		var j journal
		gone := fake.NewClientBuilder().Build() // the API server: the object is gone, the client's cache lags
		r := reconciler(t, controller, gone, rec, &j)
		if _, err := r.Reconcile(context.Background(), request("obj")); err != nil {
			t.Fatalf("Reconcile = %v, want nil: a deleted object has nothing left to run", err)
		}
		select {
		case e := <-rec.Events:
			t.Fatalf("event %q, want none", e)
		default:
		}
		if got := saveFailures(t, controller, "invalid"); got != 0 || len(j.all()) != 0 {
			t.Fatalf("metric %v, runs %q; want 0 and none", got, j.all())
		}
	})
}
