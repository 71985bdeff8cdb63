package runnable

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/quiesce-dev/quiesce/drain"
)

const (
	reviewUID = "uid-1"            // the UID of admissionReview's requests
	jsonType  = "application/json" // the Content-Type of an AdmissionReview
)

// connectedWebhookServer returns the webhook server of a new Runnable over a fakeServer,
// as Setup wraps it; the Runnable logs to logs.
func connectedWebhookServer(logs *lines) (*Runnable, *webhookServer) {
	r := newRunnable(withDefaults(Options{Logger: logs.logger()}), false)
	return r, wrapServer(r, newFakeServer())
}

// admissionReview returns a v1 AdmissionReview of a create of object (raw JSON; "" for
// none) named name in namespace.
func admissionReview(t testing.TB, namespace, name, object string) []byte {
	t.Helper()
	ar := admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{
		UID: reviewUID, Namespace: namespace, Name: name, Operation: admissionv1.Create,
	}}
	ar.SetGroupVersionKind(admissionv1.SchemeGroupVersion.WithKind("AdmissionReview"))
	if object != "" {
		ar.Request.Object = runtime.RawExtension{Raw: []byte(object)}
	}
	data, err := json.Marshal(ar)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// post serves a POST of body at path on h, as the API server sends an AdmissionReview.
func post(h http.Handler, path string, body io.Reader) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, body)
	req.Header.Set("Content-Type", jsonType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// response decodes the AdmissionReview in rec.
func response(t *testing.T, rec *httptest.ResponseRecorder) *admissionv1.AdmissionResponse {
	t.Helper()
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &ar); err != nil || ar.Response == nil {
		t.Fatalf("response %d %q is not an AdmissionReview with a response: %v", rec.Code, rec.Body, err)
	}
	return ar.Response
}

// callNames is an admission.Handler that records the name of the tracked call each Handle
// runs in ("" outside one) and allows.
type callNames struct {
	mu    sync.Mutex
	names []string
}

func (c *callNames) Handle(ctx context.Context, _ admission.Request) admission.Response {
	_, name, _ := drain.FromContext(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = append(c.names, name)
	return admission.Allowed("")
}

func (c *callNames) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.names...)
}

func TestAdmissionCallNames(t *testing.T) {
	_, ws := connectedWebhookServer(&lines{})
	names := &callNames{}
	ws.Register("/validate-v1-job", &admission.Webhook{Handler: names})
	for _, tc := range []struct {
		what, namespace, name, object string
		want                          string
	}{
		{"namespaced", "ns", "a", `{"metadata":{"name":"a","namespace":"ns"}}`, "webhook/validate-v1-job/ns/a"},
		{"cluster-scoped", "", "node-1", `{"metadata":{"name":"node-1"}}`, "webhook/validate-v1-job/node-1"},
		{"generateName", "ns", "", `{"apiVersion":"batch/v1","kind":"Job","metadata":{"generateName":"pi-",` +
			`"labels":{"a":"b"}},"spec":{"template":{}}}`, "webhook/validate-v1-job/ns/pi-"},
		{"generateName after other keys", "ns", "", `{"spec":{"x":[1,{"metadata":{"generateName":"no-"}}]},` +
			`"metadata":{"generateName":"g-"}}`, "webhook/validate-v1-job/ns/g-"},
		{"no name, no generateName", "ns", "", `{"metadata":{"labels":{}}}`, "webhook/validate-v1-job/ns"},
		{"no name, no object", "ns", "", "", "webhook/validate-v1-job/ns"},
		{"generateName not a string", "", "", `{"metadata":{"generateName":5}}`, "webhook/validate-v1-job"},
	} {
		rec := post(ws.WebhookMux(), "/validate-v1-job", strings.NewReader(string(admissionReview(t, tc.namespace, tc.name, tc.object))))
		if res := response(t, rec); !res.Allowed || res.UID != reviewUID {
			t.Errorf("%s: response %+v, want allowed, with the request's UID", tc.what, res)
		}
		if got := names.get(); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: the handler ran in the calls %q, want %q", tc.what, got, tc.want)
		}
		names.names = nil
	}
}

// countingBody is a request body that counts the bytes read from it.
type countingBody struct {
	r      io.Reader
	n      int
	closed bool
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += n
	return n, err
}

func (b *countingBody) Close() error {
	b.closed = true
	return nil
}

// A handler that is not an *admission.Webhook (a conversion webhook, a handler of one's
// own) runs as a call named after its path, with the body as sent: the part read to name
// the call put back, then the rest, however long, and the original closed.
func TestOtherHandlerCallIsNamedAfterThePath(t *testing.T) {
	_, ws := connectedWebhookServer(&lines{})
	for _, size := range []int{0, 100, maxReviewBytes + 10} {
		sent := strings.Repeat("x", size)
		body := &countingBody{r: strings.NewReader(sent)}
		var name, got string
		ws.Register("/convert", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			_, name, _ = drain.FromContext(req.Context())
			b, _ := io.ReadAll(req.Body)
			got = string(b)
			_ = req.Body.Close()
			w.WriteHeader(http.StatusTeapot)
		}))
		req := httptest.NewRequest(http.MethodPost, "/convert", nil)
		req.Body = body
		rec := httptest.NewRecorder()
		ws.WebhookMux().ServeHTTP(rec, req)
		if rec.Code != http.StatusTeapot || name != "webhook/convert" || got != sent || !body.closed {
			t.Errorf("%d bytes: got %d in the call %q, body as sent %v, closed %v; want 418 in webhook/convert, "+
				"the body as sent, closed", size, rec.Code, name, got == sent, body.closed)
		}
		ws.Server.(*fakeServer).mux = http.NewServeMux()
	}
}

// A body the Webhook cannot decode is answered as without quiesce, in a call named after the
// path; so is a review without a request.
func TestMalformedAdmissionServedAsBefore(t *testing.T) {
	for _, tc := range []struct {
		body, contentType string
		want              []string // the calls the handler runs in
	}{
		{"not json", jsonType, nil},
		{`{"request":`, jsonType, nil},
		{string(admissionReview(t, "ns", "x", `{}`)), "text/plain", nil}, // refused by the Webhook
		{`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}`, jsonType, []string{"webhook/m"}},
		{"", jsonType, []string{"webhook/m"}}, // decoded as an empty review
	} {
		r, ws := connectedWebhookServer(&lines{})
		names := &callNames{}
		ws.Register("/m", &admission.Webhook{Handler: names})
		plain := &admission.Webhook{Handler: &callNames{}}
		serve := func(h http.Handler) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/m", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		got, want := serve(ws.WebhookMux()), serve(plain)
		if got.Code != want.Code || got.Body.String() != want.Body.String() {
			t.Errorf("body %q: wrapped answered %d %q, unwrapped %d %q", tc.body, got.Code, got.Body, want.Code, want.Body)
		}
		if n := names.get(); strings.Join(n, "|") != strings.Join(tc.want, "|") || r.ex.Stats().Started != 1 {
			t.Errorf("body %q: the handler ran in the calls %q (Stats %+v), want %q", tc.body, n, r.ex.Stats(), tc.want)
		}
	}
}

func TestAdmissionPanics(t *testing.T) {
	boom := admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { panic("boom") })
	abort := admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		panic(http.ErrAbortHandler)
	})
	body := func() io.Reader { return strings.NewReader(string(admissionReview(t, "ns", "x", `{}`))) }
	onePanicLine := func(t *testing.T, logs *lines, name string) {
		t.Helper()
		n := 0
		for _, m := range logs.messages() {
			if m == "Webhook handler panicked" {
				n++
			}
		}
		if l := logs.line("Webhook handler panicked"); n != 1 || !strings.Contains(l, `"name"="`+name+`"`) ||
			!strings.Contains(l, "boom") || !strings.Contains(l, "webhook_name_test.go") {
			t.Errorf("%d panic lines, the first %q; want one, with the name %s, the value and the handler's stack", n, l, name)
		}
	}

	t.Run("RecoverPanic on: the Webhook's own error response", func(t *testing.T) {
		logs := &lines{}
		r, ws := connectedWebhookServer(logs)
		ws.Register("/p", &admission.Webhook{Handler: boom})
		rec := post(ws.WebhookMux(), "/p", body())
		if res := response(t, rec); rec.Code != http.StatusOK || res.Allowed || res.Result == nil ||
			res.Result.Code != http.StatusInternalServerError || !strings.Contains(res.Result.Message, "boom") || res.UID != reviewUID {
			t.Errorf("response %d %+v, want the Webhook's error response: 500 in the review, naming the panic", rec.Code, res)
		}
		// The Webhook recovered, logged and counted it (controller-runtime's metric): the call returned.
		if s := r.ex.Stats(); s.Started != 1 || s.Panicked != 0 || s.InFlight != 0 || len(logs.messages()) != 0 {
			t.Errorf("Stats = %+v, log %q; want the call returned, nothing logged again", s, logs.messages())
		}
	})

	t.Run("RecoverPanic off: 500", func(t *testing.T) {
		logs := &lines{}
		r, ws := connectedWebhookServer(logs)
		ws.Register("/p", (&admission.Webhook{Handler: boom}).WithRecoverPanic(false))
		rec := post(ws.WebhookMux(), "/p", body())
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "webhook handler panicked") {
			t.Errorf("response %d %q, want 500", rec.Code, rec.Body)
		}
		onePanicLine(t, logs, "webhook/p/ns/x")
		if s := r.ex.Stats(); s.Panicked != 1 || s.InFlight != 0 {
			t.Errorf("Stats = %+v, want 1 panicked, none in flight", s)
		}
	})

	t.Run("ErrAbortHandler aborts the response", func(t *testing.T) {
		logs := &lines{}
		_, ws := connectedWebhookServer(logs)
		ws.Register("/abort", (&admission.Webhook{Handler: abort}).WithRecoverPanic(false))
		func() {
			defer func() {
				if v := recover(); v != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself
					t.Errorf("recovered %v, want http.ErrAbortHandler, for net/http to abort the response", v)
				}
			}()
			post(ws.WebhookMux(), "/abort", body())
		}()
		if l := logs.line("Webhook handler panicked"); l != "" {
			t.Errorf("logged %q for http.ErrAbortHandler", l)
		}
	})

	t.Run("outside the Handler: logged, named after the request, 500", func(t *testing.T) {
		logs := &lines{}
		r, ws := connectedWebhookServer(logs)
		names := &callNames{}
		ws.Register("/p", &admission.Webhook{Handler: names, WithContextFunc: func(context.Context, *http.Request) context.Context {
			panic("boom")
		}})
		rec := post(ws.WebhookMux(), "/p", body())
		if rec.Code != http.StatusInternalServerError {
			t.Errorf("response %d %q, want 500", rec.Code, rec.Body)
		}
		onePanicLine(t, logs, "webhook/p/ns/x")
		if s := r.ex.Stats(); s.Panicked != 1 || len(names.get()) != 0 {
			t.Errorf("Stats = %+v, handler calls %q; want the call panicked, the handler not run", s, names.get())
		}
	})
}

func TestAdmissionServedUntrackedOnceTheDrainBegan(t *testing.T) {
	r, ws := connectedWebhookServer(&lines{})
	names := &callNames{}
	ws.Register("/v", &admission.Webhook{Handler: names})
	if err := r.ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := post(ws.WebhookMux(), "/v", strings.NewReader(string(admissionReview(t, "ns", "x", `{}`))))
	if res := response(t, rec); !res.Allowed {
		t.Errorf("response %+v, want the handler's", res)
	}
	if got := names.get(); len(got) != 1 || got[0] != "" {
		t.Errorf("the handler ran in the calls %q, want once, untracked", got)
	}
	if s := r.ex.Stats(); s.Refused != 1 || s.Started != 0 {
		t.Errorf("Stats = %+v, want the call refused", s)
	}
}

func TestAdmissionWebhookAtTwoPaths(t *testing.T) {
	_, ws := connectedWebhookServer(&lines{})
	names := &callNames{}
	wh := &admission.Webhook{Handler: names}
	ws.Register("/a", wh)
	ws.Register("/b", wh)
	if wh.Handler != admission.Handler(names) {
		t.Fatalf("Handler = %#v, want the caller's Webhook left as it was", wh.Handler)
	}
	post(ws.WebhookMux(), "/b", strings.NewReader(string(admissionReview(t, "ns", "x", `{}`))))
	post(ws.WebhookMux(), "/a", strings.NewReader(string(admissionReview(t, "ns", "y", `{}`))))
	if got := names.get(); len(got) != 2 || got[0] != "webhook/b/ns/x" || got[1] != "webhook/a/ns/y" {
		t.Errorf("the handler ran in the calls %q, want one per request, named after its path", got)
	}
}

// Once the stop began, admission responses carry "Connection: close" too, and the call is
// still named after the request.
func TestAdmissionOnceTheStopBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rp := newReplica(t, Options{GracePeriod: 10 * time.Second, ShutdownDelay: 5 * time.Second})
		names := &callNames{}
		rp.ws.Register("/v", &admission.Webhook{Handler: names})
		rp.sigterm()
		synctest.Wait()
		rec, cancel, done := rp.inner.serve("/v", string(admissionReview(t, "ns", "x", `{}`)))
		<-done
		cancel()
		if res := response(t, rec); !res.Allowed || rec.Header().Get("Connection") != connectionClose {
			t.Errorf("response %+v, Connection: %q; want allowed, close", res, rec.Header().Get("Connection"))
		}
		if got := names.get(); len(got) != 1 || got[0] != "webhook/v/ns/x" {
			t.Errorf("the handler ran in the calls %q, want webhook/v/ns/x", got)
		}
		if err := rp.stop(); err != nil {
			t.Fatal(err)
		}
	})
}
