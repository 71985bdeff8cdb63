package runnable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// webhookServer is the webhook server of Setup: see Runnable.Add.
type webhookServer struct {
	webhook.Server // the inner server, whose other methods it keeps
	r              *Runnable
	started        atomic.Bool
}

// errServerStopping ends the inner server's context; requests keep theirs (liveContext).
var errServerStopping = errors.New("quiesce webhook server stopping")

func (s *webhookServer) Register(at string, h http.Handler) {
	s.Server.Register(at, &trackedHook{r: s.r, path: strings.Trim(at, "/"), hook: h})
}

// Start runs the inner server until ctx ends, for one manager, whose Runnable was added.
func (s *webhookServer) Start(ctx context.Context) error {
	switch {
	case !s.r.setup.added.Load():
		return errors.New("failed to start quiesce webhook server: q.Add(mgr) was not called " +
			"for the manager made from the Options given to runnable.Setup")
	case !s.started.CompareAndSwap(false, true):
		return errors.New("failed to start quiesce webhook server: it serves another manager already: " +
			"call runnable.Setup on each manager's own Options")
	}
	innerCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	defer context.AfterFunc(ctx, func() { cancel(errServerStopping) })()
	err := s.Server.Start(innerCtx)
	if s.r.stop.began() {
		s.r.stopLog().Info("Webhook server stopped", s.r.sinceStop()...)
	}
	return err
}

// trackedHook serves a registered path as tracked calls.
type trackedHook struct {
	r    *Runnable
	path string // without its slashes
	hook http.Handler
}

// maxReviewBytes is the most read of a body to name its call: controller-runtime's admission
// webhooks refuse larger ones (admission/http.go, maxRequestSize).
const maxReviewBytes = 7 << 20

func (h *trackedHook) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := h.r
	w = &closingWriter{ResponseWriter: w, stop: r.stop}
	ctx, cancel := liveContext(req.Context())
	defer cancel()
	req = req.WithContext(ctx)
	name := h.callName(req)
	ran := false
	err := r.core().Run(ctx, internal.CallOptions{Name: name, NoSlot: true}, func(ctx context.Context) error {
		ran = true
		h.hook.ServeHTTP(w, req.WithContext(ctx))
		return nil
	})
	var pe *drain.PanicError
	switch {
	case !ran && errors.Is(err, drain.ErrDraining):
		h.hook.ServeHTTP(w, req) // refusing would fail the API server's request
	case errors.As(err, &pe):
		if pe.Value == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
			panic(http.ErrAbortHandler) // net/http closes the connection quietly
		}
		r.log.Error(pe, "Webhook handler panicked", "name", internal.Cut(pe.Name), "stack", string(pe.Stack))
		http.Error(w, "webhook handler panicked", http.StatusInternalServerError)
	case !ran && err != nil: // the client went away before the call began
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	}
}

// callName names req's call after the AdmissionReview in its body, put back as it came. It
// reads no further than it needs: the API server sends request.name and namespace before
// the object (only a create without a name reads on, into its metadata.generateName).
func (h *trackedHook) callName(req *http.Request) string {
	if req.Body == nil || req.Body == http.NoBody {
		return path.Join("webhook", h.path)
	}
	var seen bytes.Buffer
	dec := json.NewDecoder(io.TeeReader(io.LimitReader(req.Body, maxReviewBytes), &seen))
	var ns, name string
	walkTo(dec, "request", func() {
		walk(dec, func(key string) bool {
			switch key {
			case "namespace":
				_ = dec.Decode(&ns)
			case "name":
				_ = dec.Decode(&name)
			case "object", "oldObject":
				if key == "object" && name == "" {
					walkTo(dec, "metadata", func() { walkTo(dec, "generateName", func() { _ = dec.Decode(&name) }) })
				}
				return true
			default:
				_ = dec.Decode(&json.RawMessage{})
			}
			return false
		})
	})
	req.Body = struct { // what was read, put back, then the rest; Close closes the original
		io.Reader
		io.Closer
	}{io.MultiReader(&seen, req.Body), req.Body}
	return path.Join("webhook", h.path, ns, name) // empty parts left out
}

// walkTo reads the JSON object next in dec up to key, and has fn read its value.
func walkTo(dec *json.Decoder, key string, fn func()) {
	walk(dec, func(k string) bool {
		if k == key {
			fn()
			return true
		}
		_ = dec.Decode(&json.RawMessage{})
		return false
	})
}

// walk reads the JSON object next in dec key by key, calling visit on each to read its value,
// until visit returns true, the object ends, or dec fails (a decoder's error sticks).
func walk(dec *json.Decoder, visit func(key string) (done bool)) {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return
	}
	for dec.More() {
		t, err := dec.Token()
		if key, ok := t.(string); err != nil || !ok || visit(key) {
			return
		}
	}
}

// closingWriter adds "Connection: close" (HTTP/2: a GOAWAY) to a header written once the
// stop began, so that the API server's next request goes to another replica.
type closingWriter struct {
	http.ResponseWriter
	stop  *stopState
	wrote bool
}

func (w *closingWriter) WriteHeader(code int) {
	w.mark()
	w.ResponseWriter.WriteHeader(code)
}

func (w *closingWriter) Write(b []byte) (int, error) {
	w.mark()
	return w.ResponseWriter.Write(b)
}

func (w *closingWriter) mark() {
	if !w.wrote && w.stop.began() {
		w.Header().Set("Connection", "close")
	}
	w.wrote = true
}

// Unwrap returns the ResponseWriter, for http.ResponseController.
func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// liveContext returns parent's values, ending with parent but not with the server's stop
// (controller-runtime v0.24 on cancels requests then): the drain bounds them instead.
func liveContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	stop := context.AfterFunc(parent, func() {
		if cause := context.Cause(parent); !errors.Is(cause, errServerStopping) {
			cancel(cause) // the client went away
		}
	})
	return ctx, func() {
		stop()
		cancel(nil)
	}
}
