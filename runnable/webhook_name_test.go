package runnable

import (
	"bytes"
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
		{"no name, no generateName", "ns", "", `{"metadata":{"labels":{}}}`, "webhook/validate-v1-job/ns"}, //nolint:goconst // a table
		{"no name, no object", "ns", "", "", "webhook/validate-v1-job/ns"},
		{"generateName not a string", "", "", `{"metadata":{"generateName":5}}`, "webhook/validate-v1-job"},
		{"generateName by another case", "ns", "", `{"Metadata":{"GenerateName":"x-"}}`, "webhook/validate-v1-job/ns"},
		// Escaped, never cleaned: no name shows as another kind of call.
		{"a path for a name", "ns", "../../../memcached/prod/db", `{}`,
			"webhook/validate-v1-job/ns/..%2F..%2F..%2Fmemcached%2Fprod%2Fdb"},
		{"dots", "..", "..", `{}`, "webhook/validate-v1-job/../.."},
		{"a generateName with a slash", "ns", "", `{"metadata":{"generateName":"a/b"}}`, "webhook/validate-v1-job/ns/a%2Fb"},
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
// own) runs as a call named after its path, with the body as sent, never read before it
// (a ConversionReview of 8 MiB included) and closed as the original.
func TestOtherHandlerCallIsNamedAfterThePath(t *testing.T) {
	_, ws := connectedWebhookServer(&lines{})
	conversion := `{"kind":"ConversionReview","apiVersion":"apiextensions.k8s.io/v1","request":{"uid":"u",` +
		`"desiredAPIVersion":"v2","objects":[{"metadata":{"name":"a","namespace":"ns"},"data":"` + strings.Repeat("x", 8<<20) + `"}]}}`
	for _, sent := range []string{"", strings.Repeat("x", 100), conversion} {
		body := &countingBody{r: strings.NewReader(sent)}
		var name, got string
		readBefore := -1
		ws.Register("/convert", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			readBefore = body.n
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
		if rec.Code != http.StatusTeapot || name != "webhook/convert" || readBefore != 0 || got != sent || !body.closed {
			t.Errorf("%d bytes: got %d in the call %q, %d bytes read before the handler, body as sent %v, closed %v; "+
				"want 418 in webhook/convert, none read before, the body as sent, closed", len(sent), rec.Code, name,
				readBefore, got == sent, body.closed)
		}
		ws.Server.(*fakeServer).mux = http.NewServeMux()
	}
}

// With "request" twice in the review, controller-runtime decodes both into one request (the
// later keys win): the call is named after what the handler serves, whatever came first.
func TestAdmissionNamedAfterWhatTheHandlerServes(t *testing.T) {
	_, ws := connectedWebhookServer(&lines{})
	var served []string
	ws.Register("/v", &admission.Webhook{Handler: admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		_, name, _ := drain.FromContext(ctx)
		served = append(served, name, req.Namespace+"/"+req.Name)
		return admission.Allowed("")
	})})
	decoy := `{"uid":"uid-1","namespace":"kube-system","name":"decoy","operation":"CREATE","object":{"metadata":{"name":"decoy"}}}`
	served2 := `{"uid":"uid-1","namespace":"prod","name":"real","operation":"CREATE","object":{"metadata":{"name":"real"}}}`
	for _, order := range [][2]string{{decoy, served2}, {served2, decoy}} {
		served = nil
		body := `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":` + order[0] + `,"request":` + order[1] + `}`
		if res := response(t, post(ws.WebhookMux(), "/v", strings.NewReader(body))); !res.Allowed {
			t.Fatalf("response %+v, want allowed", res)
		}
		if len(served) != 2 || served[0] != "webhook/v/"+served[1] {
			t.Errorf("the handler served %q in the call %q, want the call named after it", served[1:], served[:1])
		}
	}
}

// An admission request costs what the Webhook alone costs in memory, however large what
// precedes its request (6 MiB here), and its body reaches the Webhook unread: no copy.
func TestAdmissionMemory(t *testing.T) {
	body := []byte(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","padding":"` + strings.Repeat("x", 6<<20) +
		`","request":{"uid":"uid-1","namespace":"ns","name":"cm","operation":"CREATE","object":{"metadata":{"name":"cm"}}}}`)
	wrapped, unwrapped := admissionServer(t, body, true), admissionServer(t, body, false)
	wb, _ := memPerRun(3, wrapped)
	ub, _ := memPerRun(3, unwrapped)
	if wb > 1.1*ub {
		t.Errorf("a request of %d bytes allocates %.0f bytes wrapped, %.0f unwrapped (%.2fx); want at most 1.1x",
			len(body), wb, ub, wb/ub)
	}

	_, ws := connectedWebhookServer(&lines{})
	counted := &countingBody{r: bytes.NewReader(body)}
	readBefore := -1
	ws.Register("/v", &admission.Webhook{Handler: &callNames{}, WithContextFunc: func(ctx context.Context, _ *http.Request) context.Context {
		readBefore = counted.n // the Webhook reads the body right after
		return ctx
	}})
	req := httptest.NewRequest(http.MethodPost, "/v", nil)
	req.Header.Set("Content-Type", jsonType)
	req.Body = counted
	rec := httptest.NewRecorder()
	ws.WebhookMux().ServeHTTP(rec, req)
	if res := response(t, rec); !res.Allowed || readBefore != 0 || counted.n != len(body) {
		t.Errorf("response %+v; %d bytes read before the Webhook, %d in all; want allowed, 0, %d", res, readBefore, counted.n, len(body))
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

	t.Run("outside the Handler: logged, named after the path, 500", func(t *testing.T) {
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
		onePanicLine(t, logs, "webhook/p") // before the Webhook decoded the request
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
	if n, ok := wh.Handler.(namingHandler); !ok || n.Handler != admission.Handler(names) {
		t.Fatalf("Handler = %#v, want the caller's Handler wrapped once, in place", wh.Handler)
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
