package runnable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"runtime/debug"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// This file names the calls of a WebhookServer without reading a request's body: an
// *admission.Webhook (what ctrl.NewWebhookManagedBy registers) decodes the AdmissionReview
// once, as it does without quiesce, and the tracked call starts inside its Handler, from
// the admission.Request it decoded. Any other handler is tracked around its ServeHTTP,
// named after its path alone.

// newTrackedHook returns what Register registers at path for hook. If hook is an
// *admission.Webhook with a Handler, its Handler is wrapped (once: a Webhook registered at
// several paths has its calls named after the first) so that each request it handles is a
// tracked call named after the request.
func newTrackedHook(s *webhookServer, path string, hook http.Handler) *trackedHook {
	name := strings.Trim(path, "/")
	h := &trackedHook{s: s, name: name, call: webhookCallName(name, "", ""), hook: hook}
	if wh, ok := hook.(*admission.Webhook); ok && wh != nil && wh.Handler != nil {
		// A Webhook of its own, so that the caller's is left as it was: its exported fields
		// (the same from controller-runtime v0.22 through v0.25), its Handler wrapped.
		cp := &admission.Webhook{RecoverPanic: wh.RecoverPanic, WithContextFunc: wh.WithContextFunc,
			LogConstructor: wh.LogConstructor}
		cp.Handler = &trackedHandler{hook: h, wh: cp, inner: wh.Handler}
		h.hook, h.admission = cp, true
	}
	return h
}

// trackedHandler wraps the Handler of an admission.Webhook registered on a WebhookServer:
// it runs each Handle as a tracked call named "webhook/<path>/<namespace>/<name>" after
// the request, on the caller's goroutine (so the handler's own frames are where reports
// show the call waiting).
//
// A panic in the handler is logged here ("Webhook handler panicked", with the call's name
// and the handler's stack) and counted by the executor, then raised again, for the
// Webhook to answer as it does without quiesce: with RecoverPanic on (controller-runtime's
// default), its own error response (an AdmissionReview with code 500), its panic metric and
// utilruntime's panic handlers; with RecoverPanic off, the panic leaves the Webhook and
// the trackedHook answers HTTP 500 without logging it again. http.ErrAbortHandler is
// raised again unlogged, as the trackedHook does for other handlers.
type trackedHandler struct {
	hook  *trackedHook
	wh    *admission.Webhook
	inner admission.Handler
}

var _ admission.Handler = (*trackedHandler)(nil)

// Handle runs the inner Handler's Handle as a tracked call; untracked once the executor
// refuses calls (the drain began), as the trackedHook serves other handlers.
func (t *trackedHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	r := t.hook.s.r.Load()
	if r == nil { // not connected: Start fails, so this serves only tests of the hook itself
		return t.inner.Handle(ctx, req)
	}
	c := &admissionCall{inner: t.inner, req: req}
	err := r.core().Run(ctx, internal.CallOptions{Name: admissionCallName(t.hook.name, &req), NoSlot: true}, c.run)
	if err == nil {
		return c.resp
	}
	var pe *drain.PanicError
	switch {
	case !c.ran && errors.Is(err, drain.ErrDraining):
		return t.inner.Handle(ctx, req)
	case errors.As(err, &pe):
		if pe.Value == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
			panic(http.ErrAbortHandler)
		}
		r.log.Error(pe, "Webhook handler panicked", "name", internal.Cut(pe.Name), "stack", string(pe.Stack))
		if t.wh.RecoverPanic != nil && !*t.wh.RecoverPanic {
			panic(loggedPanic{pe}) // out of the Webhook, to trackedHook.recoverAdmission
		}
		panic(pe.Value) // to the Webhook's RecoverPanic
	case !c.ran: // refused otherwise (the client went away first): the Webhook answers the error
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return c.resp // fn returns nil: not reached
}

// admissionCall is one Handle run as a tracked call; one allocation holds what its fn needs.
type admissionCall struct {
	inner admission.Handler
	req   admission.Request
	resp  admission.Response
	ran   bool
}

func (c *admissionCall) run(ctx context.Context) error {
	c.ran = true
	c.resp = c.inner.Handle(ctx, c.req)
	return nil
}

// loggedPanic is what a trackedHandler raises once it logged a panic that the Webhook
// does not recover (RecoverPanic off): trackedHook.recoverAdmission answers 500 and does
// not log it again. Its text is the *drain.PanicError's, for the Webhook's own log line.
type loggedPanic struct{ *drain.PanicError }

// recoverAdmission, deferred by trackedHook.ServeHTTP around an *admission.Webhook,
// answers a panic that left the Webhook with 500, as ServeHTTP answers the panic of any
// other handler. A panic the trackedHandler did not log (one outside the Handler: in the
// Webhook's WithContextFunc or LogConstructor, say) is logged here, named after the path,
// with the stack where it was recovered; it happened outside any tracked call, so the
// executor does not count it. http.ErrAbortHandler is raised again.
func (h *trackedHook) recoverAdmission(w http.ResponseWriter, r *Runnable) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
		panic(v)
	}
	if _, logged := v.(loggedPanic); !logged {
		pe := &drain.PanicError{Name: h.call, Value: v, Stack: debug.Stack()}
		r.log.Error(pe, "Webhook handler panicked", "name", internal.Cut(pe.Name), "stack", string(pe.Stack))
	}
	http.Error(w, "webhook handler panicked", http.StatusInternalServerError)
}

// admissionCallName names the call of req at path: its namespace and name, or, when it
// has no name (a create with metadata.generateName), the object's generateName.
func admissionCallName(path string, req *admission.Request) string {
	name := req.Name
	if name == "" {
		name = generateName(req.Object.Raw)
	}
	return webhookCallName(path, req.Namespace, name)
}

// generateName returns metadata.generateName of the JSON object raw, or "" when raw is
// not a JSON object or has none. It decodes no more than the object's metadata: the keys
// before "metadata" are skipped (the API server sends apiVersion and kind first, then
// metadata, for built-in types and custom resources alike), and the rest of the object
// (spec, data, status) is never read. It costs a small decoder, a copy of the object up to
// the end of its metadata, and a scan of that part; only requests without a name (creates
// with generateName) pay it.
func generateName(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return ""
		}
		if key, _ := t.(string); key == "metadata" {
			var m struct {
				GenerateName string `json:"generateName"`
			}
			if dec.Decode(&m) != nil {
				return ""
			}
			return m.GenerateName
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}
