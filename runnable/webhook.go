package runnable

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
)

// WebhookServer wraps the manager's webhook server: pass it as ctrl.Options.WebhookServer,
// and the same ctrl.Options as Options.ManagerOptions to Add, which connects it to the
// Runnable. Handlers registered on it (by ctrl.NewWebhookManagedBy, or by Register) then:
//
//   - run each request as a tracked call of the Runnable's executor: reports,
//     /debug/quiesce and the metrics show it. For an *admission.Webhook (what
//     ctrl.NewWebhookManagedBy registers), the call is its Handler's Handle (Register
//     wraps the Handler field in place), named "webhook/<path>/<namespace>/<name>" after
//     the admission.Request that controller-runtime decoded (the object's generateName
//     when it has no name yet; the parts that are empty left out): the wrapper reads no
//     body and decodes nothing more. Any other handler (a conversion webhook, a handler
//     of your own) runs as a call named "webhook/<path>", its body untouched;
//   - get a context that the server's stop does not cancel (controller-runtime v0.24 and
//     later cancel it when the webhook server stops), only the client going away, or the
//     drain at CancelAfter;
//   - never wait for nor hold a MaxConcurrent slot (it bounds reconciles and their calls);
//   - from the moment the stop begins, answer with "Connection: close" (HTTP/2: a graceful
//     GOAWAY), so that the API server's keep-alive connections move to a ready replica.
//
// The webhooks stop last, as controller-runtime orders them ("they might be still serving
// some requests"): the wrapper serves until the manager stops the webhook group, after the
// drain of this replica's reconciles and calls, and the caches; then the inner server
// closes its listener and waits for the requests in flight, whose contexts stay live. The
// drain waits for the admission calls that began before it (on standbys too); a request
// that arrives once the drain began is served untracked: the executor refuses new calls,
// and failing an admission would fail the API server's request (a reconcile of this
// replica that writes an object its own webhook validates is still admitted).
//
// A handler that panics is logged ("Webhook handler panicked", with the call's name and
// stack) and counted; then an *admission.Webhook answers as it does itself (with
// RecoverPanic, its default: an AdmissionReview with code 500, and its panic metric), and
// any other handler, or an admission.Webhook without RecoverPanic, gets an HTTP 500;
// http.ErrAbortHandler still aborts the response. Handlers added to
// WebhookMux directly are served, but not tracked. A wrapper that Add did
// not connect fails to start ("not connected"), so that the manager does not start.
// WebhookServer panics if inner is nil.
func WebhookServer(inner webhook.Server) webhook.Server {
	if internal.IsNil(inner) {
		panic("runnable.WebhookServer: nil inner server (pass webhook.NewServer(...))")
	}
	return &webhookServer{inner: inner}
}

// errNotConnected is what the Start of a WebhookServer that Add did not connect returns.
var errNotConnected = errors.New("failed to start quiesce webhook server: not connected to a quiesce Runnable: " +
	"pass the ctrl.Options holding it to runnable.Add as Options.ManagerOptions")

// errServerStopping is the cause with which the wrapper cancels the inner server's
// context: requests in flight see it, and keep a live context.
var errServerStopping = errors.New("quiesce webhook server stopping")

type webhookServer struct {
	inner     webhook.Server
	r         atomic.Pointer[Runnable]
	fromSetup bool // installed by Setup, before the server is shared
}

var _ webhook.Server = (*webhookServer)(nil)

// connect connects s to r; false if s is connected to another Runnable.
func (s *webhookServer) connect(r *Runnable) bool { return s.r.CompareAndSwap(nil, r) }

// disconnect undoes connect(r), for an Add that failed.
func (s *webhookServer) disconnect(r *Runnable) {
	if s != nil {
		s.r.CompareAndSwap(r, nil)
	}
}

// NeedLeaderElection is the inner server's (false for controller-runtime's).
func (s *webhookServer) NeedLeaderElection() bool { return s.inner.NeedLeaderElection() }

// Register registers hook at path on the inner server, wrapped as the WebhookServer doc says.
func (s *webhookServer) Register(path string, hook http.Handler) {
	s.inner.Register(path, newTrackedHook(s, path, hook))
}

// StartedChecker is the inner server's.
func (s *webhookServer) StartedChecker() healthz.Checker { return s.inner.StartedChecker() }

// WebhookMux is the inner server's: handlers added to it directly are not tracked.
func (s *webhookServer) WebhookMux() *http.ServeMux { return s.inner.WebhookMux() }

// Start runs the inner server until ctx ends (the manager stops the webhooks last), and
// returns once the inner server returned. The inner server gets a context of its own, that
// ends with ctx: its requests in flight keep a live context (see liveContext).
func (s *webhookServer) Start(ctx context.Context) error {
	r := s.r.Load()
	if r == nil {
		return errNotConnected
	}
	innerCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(errServerStopping) })
	defer stop()

	err := s.inner.Start(innerCtx)
	if r.stop.began() {
		r.stopLog().Info("Webhook server stopped", r.sinceStop()...)
	}
	return err
}

// trackedHook serves one registered path.
type trackedHook struct {
	s    *webhookServer
	name string // the path without its slashes
	call string // "webhook/<path>": the name of a call that no admission.Request names
	hook http.Handler
	// admission: hook is an *admission.Webhook whose Handler a trackedHandler wraps, and
	// so runs the tracked call itself; ServeHTTP starts none.
	admission bool
}

func (h *trackedHook) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := h.s.r.Load()
	if r == nil { // not connected: Start fails, so this serves only tests of the hook itself
		h.hook.ServeHTTP(w, req)
		return
	}
	w = &closingWriter{ResponseWriter: w, stop: r.stop}
	ctx, cancel := liveContext(req.Context())
	defer cancel()
	if h.admission {
		// The Webhook decodes the review once; its wrapped Handler runs the tracked call,
		// named after the decoded request.
		defer h.recoverAdmission(w, r)
		h.hook.ServeHTTP(w, req.WithContext(ctx))
		return
	}
	ran := false
	err := r.core().Run(ctx, internal.CallOptions{Name: h.call, NoSlot: true}, func(ctx context.Context) error {
		ran = true
		h.hook.ServeHTTP(w, req.WithContext(ctx))
		return nil
	})
	var pe *drain.PanicError
	switch {
	case !ran && errors.Is(err, drain.ErrDraining):
		h.hook.ServeHTTP(w, req.WithContext(ctx))
	case errors.As(err, &pe):
		if pe.Value == http.ErrAbortHandler { //nolint:errorlint // the sentinel itself, as net/http compares it
			panic(http.ErrAbortHandler) // the handler aborts the response: net/http closes the connection quietly
		}
		// As controller-runtime's admission webhooks do with RecoverPanic: log it (here
		// named after the request, with its stack) and answer with an error.
		r.log.Error(pe, "Webhook handler panicked", "name", internal.Cut(pe.Name), "stack", string(pe.Stack))
		http.Error(w, "webhook handler panicked", http.StatusInternalServerError)
	}
}

// closingWriter answers with "Connection: close" when the response's header is written
// once the stop began: a request that was in flight when the stop began closes its
// connection too, so that the API server's next request goes to another replica.
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
	if !w.wrote {
		w.wrote = true
		if w.stop.began() {
			w.Header().Set("Connection", "close")
		}
	}
}

// Unwrap returns the ResponseWriter, for http.ResponseController.
func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// liveContext returns a context with parent's values that ends when parent ends, but for
// the inner server's stop (errServerStopping): a request in flight keeps a live context
// while the server shuts down, and the drain bounds it.
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

// webhookCallName is the name of an admission request's call: "webhook/<path>/<namespace>/<name>",
// leaving out the parts the request does not have.
func webhookCallName(path, namespace, name string) string {
	out := "webhook"
	for _, p := range []string{path, namespace, name} {
		if p != "" {
			out += "/" + p
		}
	}
	return out
}
