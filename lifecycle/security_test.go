package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/lifecycle"
)

// secret is what a client error may hold that must not be published.
const secret = "sk-live-0123456789abcdef"

// clientError is an error as a client library returns it: a URL with credentials, and a
// response that echoes the bearer token.
func clientError() error {
	return fmt.Errorf("failed to call the backend: %w", &url.Error{
		Op:  "Post",
		URL: "https://admin:hunter2@backend.internal.example/v1/apply?token=" + secret,
		Err: errors.New("401 Unauthorized: Authorization: Bearer " + secret),
	})
}

// logged runs one reconcile of the object at objKey with a logger into lines and returns
// them.
func (f *fixture) logged() []string {
	f.t.Helper()
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{})
	if _, err := f.r.Reconcile(log.IntoContext(context.Background(), logger), request(objKey.Name)); err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
	return lines
}

func TestHandlersRedactErrorsByDefault(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "db",
		errors.New("token "+secret+" may not read secrets"))
	for _, tc := range []struct {
		name, class string
		err         error
	}{
		{"client error", "*url.Error", clientError()},
		{"API error", "Forbidden (HTTP 403)", fmt.Errorf("failed to get: %w", forbidden)},
		{"API error with a reason of the server's own", "HTTP 400", &apierrors.StatusError{ErrStatus: metav1.Status{
			Code: 400, Reason: metav1.StatusReason("token " + secret + strings.Repeat("x", 4096)), Message: secret,
		}}},
		{"API error without a reason", "HTTP 502", &apierrors.StatusError{ErrStatus: metav1.Status{Code: 502, Message: secret}}},
		{"terminal", "terminal error: *url.Error", reconcile.TerminalError(clientError())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := lifecycle.Handler[*corev1.ConfigMap]{ID: "h", Fn: func(context.Context, *corev1.ConfigMap) error { return tc.err }}
			f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{h}, lifecycle.HandlersOptions{}, configMap("obj"))
			lines := f.logged()

			ann := f.object().Annotations[lifecycle.DefaultProgressAnnotation]
			evs := f.events()
			for _, leak := range []string{secret, "hunter2", "backend.internal.example"} {
				if strings.Contains(ann, leak) {
					t.Errorf("the annotation holds %q: %s", leak, ann)
				}
				for _, e := range evs {
					if strings.Contains(e, leak) {
						t.Errorf("an Event holds %q: %s", leak, e)
					}
				}
			}
			want := tc.class + " (details in the operator's log)"
			if msg := f.record().Handlers["h"].Message; msg != want {
				t.Errorf("message = %q, want %q", msg, want)
			}
			if len(evs) != 1 || !strings.HasSuffix(evs[0], ": "+want) {
				t.Errorf("events = %q, want one ending %q", evs, want)
			}
			if !strings.Contains(strings.Join(lines, "\n"), secret) {
				t.Errorf("the operator's log lacks the whole error:\n%s", strings.Join(lines, "\n"))
			}
		})
	}
}

func TestHandlersPublishErrors(t *testing.T) {
	h := lifecycle.Handler[*corev1.ConfigMap]{ID: "h", Fn: func(context.Context, *corev1.ConfigMap) error { return clientError() }}
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{h}, lifecycle.HandlersOptions{PublishErrors: true}, configMap("obj"))
	f.reconcile("obj")
	if msg := f.record().Handlers["h"].Message; msg != clientError().Error() {
		t.Fatalf("message = %q, want the error's text", msg)
	}
	if evs := f.events(); len(evs) != 1 || !strings.Contains(evs[0], secret) {
		t.Fatalf("events = %q, want the error's text", evs)
	}
}

// key is a ProgressKey for tests.
var key = []byte("0123456789abcdef0123456789abcdef")

// signedObj is configMap("obj") with a UID, as the API server gives every object.
func signedObj(uid types.UID) *corev1.ConfigMap {
	cm := configMap(objKey.Name)
	cm.UID = uid
	return cm
}

// setProgress writes value into the progress annotation of the fixture's object, as a user
// who may patch it does.
func (f *fixture) setProgress(value string) {
	f.t.Helper()
	cm := f.object()
	from := client.MergeFrom(cm.DeepCopy())
	cm.Annotations[lifecycle.DefaultProgressAnnotation] = value
	if err := f.c.Patch(context.Background(), cm, from); err != nil {
		f.t.Fatal(err)
	}
}

func TestHandlersProgressKey(t *testing.T) {
	opts := lifecycle.HandlersOptions{ProgressKey: key}
	const done = `{"generation":1,"handlers":{"a":{"retries":0,"done":true}}}`
	for _, tc := range []struct {
		name   string
		forge  func(f *fixture, signed string) string
		forged bool // refused with ReasonProgressForged
	}{
		{"signed by the operator", func(_ *fixture, signed string) string { return signed }, false},
		{"unsigned done", func(*fixture, string) string { return done }, true},
		{"done with a made-up signature", func(*fixture, string) string {
			return strings.TrimSuffix(done, "}") + `,"mac":"AAAA"}`
		}, true},
		{"signed, then edited", func(_ *fixture, signed string) string {
			return strings.Replace(signed, `"retries":0`, `"retries":1`, 1)
		}, true},
		{"signed for another object", func(*fixture, string) string {
			other := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&journal{}, "a")}, opts, signedObj("other-uid"))
			other.reconcile("obj")
			return other.object().Annotations[lifecycle.DefaultProgressAnnotation]
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, opts, signedObj("uid-1"))
			f.reconcile("obj")
			signed := f.object().Annotations[lifecycle.DefaultProgressAnnotation]
			if !strings.Contains(signed, `"mac":"`) || !f.record().Handlers["a"].Done || len(j.all()) != 1 {
				t.Fatalf("after a first run: %s, runs %q; want a signed Record with a done", signed, j.all())
			}
			f.setProgress(tc.forge(f, signed))
			lines := f.logged()
			evs := f.events()
			runs := len(j.all())
			if !tc.forged {
				if runs != 1 || len(evs) != 0 {
					t.Fatalf("runs %d, events %q; want a not run again and no Event", runs, evs)
				}
				return
			}
			if runs != 2 || !f.record().Handlers["a"].Done {
				t.Fatalf("runs %d, record %+v; want a run again and done", runs, f.record())
			}
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+lifecycle.ReasonProgressForged+" ") {
				t.Fatalf("events = %q, want one %s", evs, lifecycle.ReasonProgressForged)
			}
			if !strings.Contains(strings.Join(lines, "\n"), "Progress record is not signed by this operator") {
				t.Fatalf("log lacks the refusal:\n%s", strings.Join(lines, "\n"))
			}
		})
	}
}

// TestHandlersProgressKeyChanged: Records written with no key, or signed with a key since
// replaced (rotated), are refused once by a reconciler with the new key: logged, reported,
// every handler runs once more, and the Record is then signed with the new key, which
// later cycles accept. Records signed with the old key are not accepted any more.
func TestHandlersProgressKeyChanged(t *testing.T) {
	newKey := []byte("fedcba9876543210fedcba9876543210")
	for _, tc := range []struct {
		name   string
		before lifecycle.HandlersOptions // the operator's options that wrote the Record
		why    string                    // in the refusal's Event
	}{
		{"unsigned, then a key", lifecycle.HandlersOptions{UnsignedProgress: true}, "no signature"},
		{"one key, then another", lifecycle.HandlersOptions{ProgressKey: key}, "signature does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			hs := []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}
			old := newFixture(t, hs, tc.before, signedObj("uid-1"))
			old.reconcile("obj")
			written := old.object().Annotations[lifecycle.DefaultProgressAnnotation]

			// The operator restarted with newKey, on the same objects.
			f := newFixtureWith(t, old.c, hs, lifecycle.HandlersOptions{ProgressKey: newKey})
			lines := f.logged()
			evs := f.events()
			if len(j.all()) != 2 || !f.record().Handlers["a"].Done {
				t.Fatalf("runs %q, record %+v; want a run once more and done", j.all(), f.record())
			}
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+lifecycle.ReasonProgressForged+" ") ||
				!strings.Contains(evs[0], tc.why) {
				t.Fatalf("events = %q, want one %s saying %q", evs, lifecycle.ReasonProgressForged, tc.why)
			}
			if !strings.Contains(strings.Join(lines, "\n"), "Progress record is not signed by this operator") {
				t.Fatalf("log lacks the refusal:\n%s", strings.Join(lines, "\n"))
			}
			resigned := f.object().Annotations[lifecycle.DefaultProgressAnnotation]
			if resigned == written || !strings.Contains(resigned, `"mac":"`) {
				t.Fatalf("Record after the new key's run: %s; want one signed anew (was %s)", resigned, written)
			}

			f.reconcile("obj")
			if evs := f.events(); len(j.all()) != 2 || len(evs) != 0 {
				t.Fatalf("runs %q, events %q; want the new key's Record accepted: no run, no Event", j.all(), evs)
			}

			// A Record of the old key, put back by someone, is refused like any forgery.
			f.setProgress(written)
			f.reconcile("obj")
			if evs := f.events(); len(j.all()) != 3 || len(evs) != 1 || !strings.Contains(evs[0], lifecycle.ReasonProgressForged) {
				t.Fatalf("runs %q, events %q; want the old Record refused and a run", j.all(), evs)
			}
		})
	}
}

// TestHandlersProgressKeyTurnedOff: a reconciler with UnsignedProgress keeps the progress of
// Records signed before (it ignores the signature): nothing runs again.
func TestHandlersProgressKeyTurnedOff(t *testing.T) {
	var j journal
	hs := []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}
	signed := newFixture(t, hs, lifecycle.HandlersOptions{ProgressKey: key}, signedObj("uid-1"))
	signed.reconcile("obj")
	f := newFixtureWith(t, signed.c, hs, lifecycle.HandlersOptions{UnsignedProgress: true})
	f.reconcile("obj")
	if evs := f.events(); len(j.all()) != 1 || len(evs) != 0 || !f.record().Handlers["a"].Done {
		t.Fatalf("runs %q, events %q, record %+v; want a run once, by the first reconciler", j.all(), evs, f.record())
	}
}

// TestHandlersCutHugeValues: 64 KiB in the annotation (written by anyone who may patch
// the object), as a handler id or as a value that fails to decode (a time, quoted whole by
// the time package's error), reaches the error, the log line and the Event cut; the error
// still wraps the decoder's.
func TestHandlersCutHugeValues(t *testing.T) {
	huge := strings.Repeat("x", 1<<16) // 64 KiB: the annotation's own limit is 256 KiB
	for name, value := range map[string]string{
		"a handler id":         `{"generation":1,"handlers":{"` + huge + `":{"retries":-1}}}`,
		"a start time":         `{"generation":1,"handlers":{"a":{"started":"` + huge + `"}}}`,
		"a delay":              `{"generation":1,"handlers":{"a":{"delayed":"` + huge + `"}}}`,
		"a generation":         `{"generation":"` + huge + `"}`,
		"a syntax error after": `{"generation":1,"` + huge + `":[}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := lifecycle.ParseRecord(value)
			if err == nil || len(err.Error()) > 400 {
				t.Fatalf("ParseRecord error of %d bytes, want an error of at most 400", len(fmt.Sprint(err)))
			}
			var pe *time.ParseError
			if strings.Contains(name, "time") && !errors.As(err, &pe) {
				t.Errorf("ParseRecord error %q does not wrap the *time.ParseError", err)
			}
			var j journal
			f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, lifecycle.HandlersOptions{}, configMap("obj"))
			f.setProgress(value)
			lines := f.logged()
			evs := f.events()
			if len(lines) == 0 || len(evs) != 1 || len(j.all()) != 1 {
				t.Fatalf("%d log lines, events %.200q, runs %q; want the corrupt Record logged, reported and a run", len(lines), evs, j.all())
			}
			for _, s := range append(lines, evs...) {
				if len(s) > 2048 {
					t.Errorf("a log line or Event of %d bytes: %.200q...", len(s), s)
				}
			}
		})
	}
}

// TestHandlersProgressTricks: each way of making the operator act on handlers it did not
// sign is refused as forged. The Record signed for handler a (done, b not yet run) is edited
// so that a decoder that merges what it reads would also see b done: b would then never run.
func TestHandlersProgressTricks(t *testing.T) {
	const forgedB = `{"b":{"retries":0,"done":true}}`
	for _, tc := range []struct {
		name  string
		forge func(signed string) string
	}{
		{"handlers twice, forged first", func(s string) string {
			return `{"handlers":` + forgedB + `,` + strings.TrimPrefix(s, "{")
		}},
		{"handlers twice, forged last", func(s string) string {
			return strings.TrimSuffix(s, "}") + `,"handlers":` + forgedB + `}`
		}},
		{"HANDLERS beside handlers", func(s string) string {
			return `{"HANDLERS":` + forgedB + `,` + strings.TrimPrefix(s, "{")
		}},
		{"Handlers in place of handlers", func(s string) string {
			return strings.Replace(s, `"handlers":`, `"Handlers":`, 1)
		}},
		{"handlers spelt with a long s", func(s string) string {
			return `{"handler\u017f":` + forgedB + `,` + strings.TrimPrefix(s, "{")
		}},
		{"generation twice", func(s string) string {
			return `{"generation":7,` + strings.TrimPrefix(s, "{")
		}},
		{"mac twice", func(s string) string {
			return `{"mac":"AAAA",` + strings.TrimPrefix(s, "{")
		}},
		{"a key twice inside an entry", func(s string) string {
			return strings.Replace(s, `"done":true`, `"done":true,"done":true`, 1)
		}},
		{"an entry twice", func(s string) string {
			return strings.Replace(s, `"handlers":{`, `"handlers":{"b":{"retries":0,"done":true},`, 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			hs := []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a"), ok(&j, "b")}
			f := newFixture(t, hs, lifecycle.HandlersOptions{ProgressKey: key, Lifecycle: lifecycle.OneByOne}, signedObj("uid-1"))
			f.reconcile("obj")
			signed := f.object().Annotations[lifecycle.DefaultProgressAnnotation]
			if got := j.all(); len(got) != 1 || got[0] != "a" {
				t.Fatalf("first cycle ran %q, want a", got)
			}
			f.setProgress(tc.forge(signed))
			lines := f.logged()
			evs := f.events()
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+lifecycle.ReasonProgressForged+" ") {
				t.Fatalf("events = %q, want one %s; log:\n%s", evs, lifecycle.ReasonProgressForged, strings.Join(lines, "\n"))
			}
			if got := j.all(); len(got) != 2 || got[1] != "a" {
				t.Fatalf("runs %q, want a run again: the forged Record refused", got)
			}
		})
	}
}

// TestHandlersProgressMoved: a Record signed by the operator is refused wherever it was not
// written: under another annotation key, for another controller, on another object.
func TestHandlersProgressMoved(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		annotation, controller   string // where the Record is read
		fromAnnotation, fromCtrl string // where it was signed
	}{
		{"another annotation", "example.com/b-progress", "cm", "example.com/a-progress", "cm"},
		{"another controller", "example.com/progress", "cm-b", "example.com/progress", "cm"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j journal
			c := fake.NewClientBuilder().WithObjects(signedObj("uid-1")).Build()
			signer := newNamedFixture(t, c, tc.fromCtrl, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")},
				lifecycle.HandlersOptions{ProgressKey: key, Annotation: tc.fromAnnotation})
			signer.reconcile("obj")
			signed := signer.object().Annotations[tc.fromAnnotation]

			reader := newNamedFixture(t, c, tc.controller, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")},
				lifecycle.HandlersOptions{ProgressKey: key, Annotation: tc.annotation})
			cm := reader.object()
			from := client.MergeFrom(cm.DeepCopy())
			cm.Annotations[tc.annotation] = signed
			if err := c.Patch(context.Background(), cm, from); err != nil {
				t.Fatal(err)
			}
			reader.reconcile("obj")
			evs := reader.events()
			if len(j.all()) != 2 || len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+lifecycle.ReasonProgressForged+" ") {
				t.Fatalf("runs %q, events %q; want the moved Record refused and a run again", j.all(), evs)
			}
		})
	}
}

// TestHandlersProgressSignedByV020: a Record that v0.2.0 signed with the same key (its MAC
// bound neither the annotation nor the controller) is not trusted after the upgrade: logged
// at Info, no Event, the handlers run once more and the Record is signed anew; a made-up MAC
// in v0.2.0's form is still refused as forged.
func TestHandlersProgressSignedByV020(t *testing.T) {
	// As v0.2.0 wrote it for uid-1 with key: a done.
	const v020 = `{"generation":1,"handlers":{"a":{"retries":0,"done":true,"started":"2025-01-02T03:04:05Z"}},` +
		`"mac":"RbMQ3eU+6gCIz7pFyt0BVS6znrbO/bmSlpLR0i7+MJs"}`
	var j journal
	f := newFixture(t, []lifecycle.Handler[*corev1.ConfigMap]{ok(&j, "a")}, lifecycle.HandlersOptions{ProgressKey: key},
		signedObj("uid-1"))
	f.setProgress(v020)
	lines := strings.Join(f.logged(), "\n")
	if evs := f.events(); len(j.all()) != 1 || len(evs) != 0 {
		t.Fatalf("runs %q, events %q; want a run once more and no Event", j.all(), evs)
	}
	if !strings.Contains(lines, "Progress record signed by an older release") {
		t.Fatalf("log lacks the upgrade line:\n%s", lines)
	}
	if resigned := f.object().Annotations[lifecycle.DefaultProgressAnnotation]; !strings.Contains(resigned, `"mac":"v2:`) {
		t.Fatalf("Record after the run: %s, want one signed by this release", resigned)
	}
	f.reconcile("obj")
	if len(j.all()) != 1 {
		t.Fatalf("runs %q, want the new Record trusted", j.all())
	}

	f.setProgress(strings.Replace(v020, "RbMQ", "AbMQ", 1))
	f.reconcile("obj")
	if evs := f.events(); len(j.all()) != 2 || len(evs) != 1 || !strings.Contains(evs[0], lifecycle.ReasonProgressForged) {
		t.Fatalf("runs %q, events %q; want a made-up v0.2.0 MAC refused as forged", j.all(), evs)
	}
}
