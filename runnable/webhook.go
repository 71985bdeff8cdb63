package runnable

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// webhookServer is the webhook server of Setup: see Runnable.Add.
type webhookServer struct {
	webhook.Server // the inner server, whose other methods it keeps
	r              *Runnable
	started        atomic.Bool
	bodies         bodies // of the requests in flight
}

// errServerStopping ends the inner server's context; requests keep theirs (liveContext).
var errServerStopping = errors.New("quiesce webhook server stopping")

// Register registers h at path on the inner server, serving each request as a tracked call.
// An *admission.Webhook's Handler is wrapped in place (the Webhook holds a sync.Once, so it is
// never copied), once, to name the call after the request it decoded.
func (s *webhookServer) Register(at string, h http.Handler) {
	name := "webhook"
	if p := strings.Trim(at, "/"); p != "" {
		name += "/" + p
	}
	if wh, ok := h.(*admission.Webhook); ok && wh.Handler != nil {
		if _, named := wh.Handler.(namingHandler); !named {
			wh.Handler = namingHandler{wh.Handler}
		}
	}
	s.Server.Register(at, &trackedHook{r: s.r, name: name, hook: h, bodies: &s.bodies})
}

// Start runs the inner server until ctx ends, for one manager, whose Runnable was added.
// Once the drain begins, the bodies of the requests in flight have until bodyDeadline.
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
	var watch sync.WaitGroup
	defer watch.Wait()
	served := make(chan struct{})
	defer close(served)
	watch.Go(func() {
		select {
		case <-s.r.ex.Draining():
			s.bodies.drainBegan(time.Now().Add(s.r.bodyWait()))
		case <-served:
		}
	})
	err := s.Server.Start(innerCtx)
	if s.r.stop.began() {
		s.r.stopLog().Info("Webhook server stopped", s.r.sinceStop()...)
	}
	return err
}

// bodyWait is how long, once the drain began, the bodies of requests have to arrive: until
// the drain cancels the calls (CancelAfter; GracePeriod if it never does).
func (r *Runnable) bodyWait() time.Duration {
	if r.cancelAfter < 0 {
		return r.grace
	}
	return r.cancelAfter
}

// minBodyWait is the least time a body has to arrive once the drain saw its request, so that
// one in transit is not cut. A variable for tests.
var minBodyWait = time.Second

// trackedHook serves a registered path as tracked calls.
type trackedHook struct {
	r      *Runnable
	name   string // "webhook/<path>", the calls' name until namingHandler renames them
	hook   http.Handler
	bodies *bodies
}

func (h *trackedHook) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := h.r
	b := h.bodies.add(w, req)
	defer h.bodies.remove(b)
	w = &closingWriter{ResponseWriter: w, stop: r.stop}
	ctx, cancel := liveContext(req.Context())
	defer cancel()
	req = req.WithContext(ctx)
	ran := false
	err := r.core().Run(ctx, internal.CallOptions{Name: h.name, NoSlot: true, Tag: h}, func(ctx context.Context) error {
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
	if b != nil && b.stalled.Load() {
		r.log.Info("Webhook request body stalled", append(r.sinceStop(), "name", internal.Cut(h.name),
			"remoteAddr", internal.Cut(req.RemoteAddr), "received", b.received.Load())...)
	}
}

// namingHandler is the Handler of an *admission.Webhook given to Register: it renames the
// call that trackedHook runs the request in after the request controller-runtime decoded,
// then calls the Webhook's own Handler.
type namingHandler struct{ admission.Handler }

func (n namingHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	if c, ok := internal.CallOf(ctx); ok {
		if o := c.Options(); o.Object == "" {
			if h, ok := o.Tag.(*trackedHook); ok && o.Name == h.name { // not a call nested in it
				c.Rename(callName(h.name, &req))
			}
		}
	}
	return n.Handler.Handle(ctx, req)
}

// callName returns "<prefix>/<namespace>/<name>" for req, with its object's generateName
// when it has no name, each part escaped (url.PathEscape) and empty ones left out.
func callName(prefix string, req *admission.Request) string {
	name := req.Name
	if name == "" && len(req.Object.Raw) > 0 {
		var obj struct {
			Metadata struct {
				GenerateName string `json:"generateName"`
			} `json:"metadata"`
		}
		// Decoded as the handler's decoder would (case-sensitive); only for an unnamed create.
		if err := kjson.UnmarshalCaseSensitivePreserveInts(req.Object.Raw, &obj); err == nil {
			name = obj.Metadata.GenerateName
		}
	}
	for _, part := range [...]string{req.Namespace, name} {
		if part != "" {
			prefix += "/" + url.PathEscape(part)
		}
	}
	return prefix
}

// bodies are the request bodies in flight on a webhook server, so that once the drain began
// a client that stalls its body ends with the drain (http.ResponseController.SetReadDeadline),
// whether its request is tracked or not.
type bodies struct {
	mu       sync.Mutex
	inFlight map[*body]struct{}
	cancelAt time.Time // when the drain cancels the calls; zero until it began
}

// body is a request's body that knows whether it was read to its end.
type body struct {
	io.ReadCloser
	w        http.ResponseWriter // for SetReadDeadline
	done     atomic.Bool         // a read returned an error: io.EOF, or it failed
	limited  atomic.Bool         // the drain set a read deadline
	stalled  atomic.Bool         // a read failed on that deadline
	received atomic.Int64        // bytes read
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.received.Add(int64(n))
	if err != nil {
		if b.limited.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
			b.stalled.Store(true)
		}
		b.done.Store(true)
	}
	return n, err
}

// add tracks req's body, replacing it; nil if req has none.
func (bs *bodies) add(w http.ResponseWriter, req *http.Request) *body {
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	b := &body{ReadCloser: req.Body, w: w}
	req.Body = b
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.inFlight == nil {
		bs.inFlight = make(map[*body]struct{})
	}
	bs.inFlight[b] = struct{}{}
	if !bs.cancelAt.IsZero() {
		b.limit(bs.deadline())
	}
	return b
}

func (bs *bodies) remove(b *body) {
	if b == nil {
		return
	}
	bs.mu.Lock()
	delete(bs.inFlight, b)
	bs.mu.Unlock()
}

// drainBegan gives the bodies still arriving until cancelAt (at least minBodyWait), and
// those of later requests until then or minBodyWait after they came.
func (bs *bodies) drainBegan(cancelAt time.Time) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.cancelAt = cancelAt
	deadline := bs.deadline()
	for b := range bs.inFlight {
		if !b.done.Load() {
			b.limit(deadline)
		}
	}
}

// deadline is when a body still arriving now stops being read. The caller holds bs.mu.
func (bs *bodies) deadline() time.Time {
	if least := time.Now().Add(minBodyWait); least.After(bs.cancelAt) {
		return least
	}
	return bs.cancelAt
}

// limit sets b's read deadline; the caller holds bodies.mu, so b's handler has not returned.
func (b *body) limit(deadline time.Time) {
	b.limited.Store(true)
	_ = http.NewResponseController(b.w).SetReadDeadline(deadline) // http.ErrNotSupported: nothing to bound
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
