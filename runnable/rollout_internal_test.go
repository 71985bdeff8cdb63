package runnable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/drain"
)

// connectionClose is the Connection header of a response once the stop began.
const connectionClose = "close"

// lines records each log line as funcr renders it.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) logger() logr.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.all = append(l.all, args)
	}, funcr.Options{})
}

// messages returns the "msg" of each line, in order.
func (l *lines) messages() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.all))
	for i, s := range l.all {
		_, rest, _ := strings.Cut(s, `"msg"="`)
		out[i], _, _ = strings.Cut(rest, `"`)
	}
	return out
}

// line returns the first line whose message is msg.
func (l *lines) line(msg string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.all {
		if strings.Contains(s, `"msg"="`+msg+`"`) {
			return s
		}
	}
	return ""
}

// fakeServer is a webhook.Server that serves without a network, deriving each request's
// context from the context Start got, as controller-runtime's server does from v0.24 on
// (http.Server.BaseContext), and that waits for the requests in flight once it ends, as
// http.Server.Shutdown does.
type fakeServer struct {
	mux      *http.ServeMux
	mu       sync.Mutex
	base     context.Context
	started  chan struct{}
	inFlight sync.WaitGroup
}

func newFakeServer() *fakeServer {
	return &fakeServer{mux: http.NewServeMux(), started: make(chan struct{})}
}

func (s *fakeServer) NeedLeaderElection() bool             { return false }
func (s *fakeServer) Register(path string, h http.Handler) { s.mux.Handle(path, h) }
func (s *fakeServer) StartedChecker() healthz.Checker {
	return func(*http.Request) error { return nil }
}
func (s *fakeServer) WebhookMux() *http.ServeMux { return s.mux }

func (s *fakeServer) Start(ctx context.Context) error {
	s.mu.Lock()
	s.base = ctx
	s.mu.Unlock()
	close(s.started)
	<-ctx.Done()
	s.inFlight.Wait()
	return nil
}

// serve serves a POST of body at path on a connection of its own; cancel ends the
// connection (the client goes away).
func (s *fakeServer) serve(path, body string) (rec *httptest.ResponseRecorder, cancel context.CancelFunc, done <-chan struct{}) {
	<-s.started
	s.mu.Lock()
	conn, cancel := context.WithCancel(s.base)
	s.mu.Unlock()
	rec = httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)).WithContext(conn)
	req.Header.Set("Content-Type", "application/json")
	ch := make(chan struct{})
	s.inFlight.Add(1)
	go func() {
		defer close(ch)
		defer s.inFlight.Done()
		s.mux.ServeHTTP(rec, req)
	}()
	return rec, cancel, ch
}

func review(namespace, name string) string {
	return fmt.Sprintf(`{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"1","namespace":%q,"name":%q,"object":{"metadata":{"name":%q}}}}`,
		namespace, name, name)
}

// replica is a Runnable and its webhook server, wired as Add wires them, under a manager
// played by the test in controller-runtime's order: the signal context goes through
// StopContext; when the manager's context ends, it stops the runnables that need no leader
// election (the Runnable), waits for them, then the leader-election group (here empty),
// then the webhooks.
type replica struct {
	r     *Runnable
	ws    *webhookServer
	inner *fakeServer
	logs  *lines

	sigterm                               context.CancelFunc // the first SIGTERM
	stopOthers, stopElected, stopWebhooks context.CancelFunc
	others, elected, webhooks             chan error
	stopped                               chan struct{} // the manager's stop is over
}

func newReplica(t *testing.T, opts Options) *replica {
	t.Helper()
	logs := &lines{}
	opts.Logger = logs.logger()
	rp := &replica{inner: newFakeServer(), logs: logs, stopped: make(chan struct{}),
		others: make(chan error, 1), elected: make(chan error, 1), webhooks: make(chan error, 1)}
	rp.r = newRunnable(withDefaults(opts), false)
	rp.ws = wrapServer(rp.r, rp.inner)
	sig, sigterm := context.WithCancel(context.Background())
	rp.sigterm = sigterm
	mgrCtx := rp.r.StopContext(sig)
	webhooks, stopWebhooks := context.WithCancel(context.Background())
	others, stopOthers := context.WithCancel(context.Background())
	elected, stopElected := context.WithCancel(context.Background())
	rp.stopWebhooks, rp.stopOthers, rp.stopElected = stopWebhooks, stopOthers, stopElected
	go func() { rp.webhooks <- rp.ws.Start(webhooks) }()
	go func() { rp.others <- rp.r.Start(others) }()
	go func() { <-elected.Done(); rp.elected <- nil }()
	go func() {
		defer close(rp.stopped)
		<-mgrCtx.Done()
		stopOthers()
		<-rp.others //nolint:errcheck // the Runnable's result: Err, which the tests check
		stopElected()
		<-rp.elected //nolint:errcheck // the empty leader-election group
		stopWebhooks()
		if err := <-rp.webhooks; err != nil {
			t.Errorf("the webhook server returned %v", err)
		}
	}()
	t.Cleanup(func() {
		sigterm()
		<-rp.stopped
	})
	return rp
}

// stop stops the replica as SIGTERM does, and returns the Runnable's Err once the
// manager's stop is over.
func (rp *replica) stop() error {
	rp.sigterm()
	<-rp.stopped
	return rp.r.Err()
}

func TestShutdownDelayOnTheLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rp := newReplica(t, Options{GracePeriod: 10 * time.Second, ShutdownDelay: 5 * time.Second})
		release := make(chan struct{})
		var ctxErr error
		rp.ws.Register("/validate", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			if string(body) != review("ns", "a") && string(body) != review("ns", "b") {
				t.Errorf("the handler got the body %q, not the review sent", body)
			}
			if strings.Contains(string(body), `"b"`) {
				<-release
				ctxErr = req.Context().Err()
			}
			w.WriteHeader(http.StatusOK)
		}))

		rec, cancel, done := rp.inner.serve("/validate", review("ns", "a"))
		<-done
		cancel()
		if rec.Header().Get("Connection") != "" {
			t.Errorf("before the stop: Connection: %q, want none", rec.Header().Get("Connection"))
		}
		recB, cancelB, doneB := rp.inner.serve("/validate", review("ns", "b"))
		defer cancelB()
		synctest.Wait()
		if p := rp.r.Executor().Pending(); len(p) != 1 || p[0].Name != "webhook/validate" {
			t.Fatalf("Pending = %+v, want the call webhook/validate", p)
		}
		if err := rp.r.ReadyzCheck(nil); err != nil {
			t.Fatalf("ReadyzCheck before the stop = %v", err)
		}

		// SIGTERM: readiness fails at once, everything keeps serving, the manager too.
		begin := time.Now()
		rp.sigterm()
		synctest.Wait()
		const says = "quiesce: shutting down: readiness fails for the 5s shutdown delay so that Services stop routing here"
		if err := rp.r.ReadyzCheck(nil); err == nil || !strings.Contains(err.Error(), says) {
			t.Fatalf("ReadyzCheck once the stop began = %v, want an error saying %q", err, says)
		}
		if rp.r.draining() {
			t.Fatal("the executor drains during the delay")
		}
		select {
		case err := <-rp.others:
			t.Fatalf("the manager stopped during the delay: the stop procedure returned %v", err)
		default:
		}
		rec, cancel, done = rp.inner.serve("/validate", review("ns", "a"))
		<-done
		cancel()
		if rec.Code != http.StatusOK || rec.Header().Get("Connection") != connectionClose {
			t.Errorf("during the delay: %d, Connection: %q, want 200 and close", rec.Code, rec.Header().Get("Connection"))
		}

		// The delay ends: the manager stops, the drain begins and waits for the request
		// in flight, which keeps a live context; the webhooks still serve.
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if !rp.r.draining() {
			t.Fatal("the executor does not drain once the delay is over")
		}
		rec, cancel, done = rp.inner.serve("/validate", review("ns", "a"))
		<-done
		cancel()
		if rec.Code != http.StatusOK {
			t.Errorf("during the drain: %d, want 200: the webhooks serve until the drain is over", rec.Code)
		}
		close(release)
		<-doneB
		if ctxErr != nil {
			t.Errorf("the request in flight saw its context end: %v", ctxErr)
		}
		if c := recB.Header().Get("Connection"); c != connectionClose {
			t.Errorf("the request in flight when the stop began: Connection: %q, want close", c)
		}
		if err := rp.stop(); err != nil {
			t.Fatalf("Err = %v", err)
		}
		if took := time.Since(begin); took != 5*time.Second {
			t.Errorf("the stop took %v, want the 5s delay", took)
		}
		want := []string{"Stop began", "Shutdown delay over", "Draining executor", "All calls returned", "Webhook server stopped"}
		if got := rp.logs.messages(); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("log messages = %q, want %q", got, want)
		}
		if l := rp.logs.line("Shutdown delay over"); !strings.Contains(l, `"sinceStop"="5s"`) {
			t.Errorf("delay line %s lacks sinceStop 5s", l)
		}
	})
}

func TestStandbyDrainsItsWebhookCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rp := newReplica(t, Options{GracePeriod: 4 * time.Second, ShutdownDelay: time.Second,
			CancelAfter: -1})
		release := make(chan struct{})
		defer close(release)
		rp.ws.Register("/mutate", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release })) // hangs
		_, cancel, _ := rp.inner.serve("/mutate", review("", "cluster-scoped"))
		defer cancel()
		synctest.Wait()

		rp.sigterm()
		synctest.Wait()
		if err := rp.r.ReadyzCheck(nil); err == nil {
			t.Fatal("a standby's ReadyzCheck once the stop began = nil")
		}
		begin := time.Now()
		<-rp.r.Done()
		if took := time.Since(begin); took != 5*time.Second {
			t.Errorf("the standby's drain took %v, want delay 1s + grace 4s", took)
		}
		err := rp.r.Err()
		var pe *drain.PendingError
		if !errors.As(err, &pe) || len(pe.Pending) != 1 || pe.Pending[0].Name != "webhook/mutate" {
			t.Fatalf("Err = %v, want the abandoned webhook/mutate", err)
		}
		if !strings.Contains(err.Error(), "after the grace period of 4s, after the 1s shutdown delay") {
			t.Errorf("Err = %q, want it to say what the grace period counts from", err)
		}
		if l := rp.logs.line(AbandonedMessage); !strings.Contains(l, `"name"="webhook/mutate"`) || !strings.Contains(l, `"sinceStop"="5s"`) {
			t.Errorf("abandoned line %q lacks the call or sinceStop", l)
		}
		release <- struct{}{}
		<-rp.stopped
	})
}

// Without a delay, readiness never fails (a single replica stays in its Service until
// its webhooks stop), and the drain begins when the manager's stop begins.
func TestNoDelayKeepsReadiness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rp := newReplica(t, Options{})
		release := make(chan struct{})
		if err := rp.r.ex.Go(context.Background(), "job", func(context.Context) error { <-release; return nil }); err != nil {
			t.Fatal(err)
		}
		rp.sigterm()
		synctest.Wait()
		if !rp.r.draining() {
			t.Fatal("the executor does not drain once the manager stops")
		}
		if err := rp.r.ReadyzCheck(nil); err != nil {
			t.Fatalf("ReadyzCheck during the drain, with no delay = %v, want nil", err)
		}
		close(release)
		if err := rp.stop(); err != nil {
			t.Fatal(err)
		}
		if err := rp.r.ReadyzCheck(nil); err != nil {
			t.Fatalf("ReadyzCheck after the stop, with no delay = %v, want nil", err)
		}
	})
}

// A Runnable whose lease nobody observes (leader election off) never fences: its calls
// end at CancelAfter, and no line speaks of leadership.
func TestNoFenceWithoutLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &lines{}
		r := newRunnable(withDefaults(Options{GracePeriod: 10 * time.Second, Logger: logs.logger()}), false)
		var cause error
		if err := r.ex.Go(context.Background(), "job", func(ctx context.Context) error {
			<-ctx.Done()
			cause = context.Cause(ctx)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		errs := make(chan error, 1)
		go func() { errs <- r.Start(ctx) }()
		synctest.Wait()
		begin := time.Now()
		stop()
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if took := time.Since(begin); took != 8*time.Second || errors.Is(cause, errLeadershipLost) {
			t.Errorf("the call ended after %v with %v, want at CancelAfter (8s), not fenced", took, cause)
		}
		if l := logs.line("Leadership lost: cancelling calls"); l != "" {
			t.Errorf("logged %s with no lease", l)
		}
	})
}

// With a ShutdownDelay, the Runnable refuses to start unless the manager's context
// came from StopContext: the delay would not keep every controller serving.
func TestDelayWithoutStopContextFailsAtStart(t *testing.T) {
	r := newRunnable(withDefaults(Options{ShutdownDelay: time.Second}), false)
	err := r.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "mgr.Start(q.StopContext(ctx))") {
		t.Fatalf("Start = %v, want the StopContext error", err)
	}
}

func TestWebhookContextEndsWhenTheClientGoesAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rp := newReplica(t, Options{})
		ended := make(chan error, 1)
		rp.ws.Register("/v", http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
			<-req.Context().Done()
			ended <- context.Cause(req.Context())
		}))
		_, cancel, done := rp.inner.serve("/v", "not json")
		synctest.Wait()
		if p := rp.r.Executor().Pending(); len(p) != 1 || p[0].Name != "webhook/v" {
			t.Fatalf("Pending = %+v, want webhook/v", p)
		}
		cancel()
		<-done
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Errorf("cause = %v, want context.Canceled", err)
		}
		if err := rp.stop(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestWebhookPanicIsNamedAndAnswered(t *testing.T) {
	logs := &lines{}
	r := newRunnable(withDefaults(Options{Logger: logs.logger()}), false)
	ws := wrapServer(r, newFakeServer())
	ws.Register("/p", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	ws.Register("/abort", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	rec := httptest.NewRecorder()
	h, _ := ws.WebhookMux().Handler(httptest.NewRequest(http.MethodPost, "/p", nil))
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/p", strings.NewReader(review("ns", "x"))))
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("a panicking handler's response = %d, want 500", rec.Code)
	}
	if l := logs.line("Webhook handler panicked"); !strings.Contains(l, `"name"="webhook/p"`) || !strings.Contains(l, "boom") ||
		!strings.Contains(l, "rollout_internal_test.go") {
		t.Errorf("panic line %q lacks the call's name, the value or the stack", l)
	}
	if s := r.ex.Stats(); s.Panicked != 1 || s.InFlight != 0 {
		t.Errorf("Stats = %+v, want 1 panicked, none in flight", s)
	}

	h, _ = ws.WebhookMux().Handler(httptest.NewRequest(http.MethodPost, "/abort", nil))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself
				t.Errorf("recovered %v, want http.ErrAbortHandler, for net/http to abort the response", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/abort", nil))
	}()
}

func TestWebhookServedOnceTheDrainBegan(t *testing.T) {
	r := newRunnable(withDefaults(Options{}), false)
	ws := wrapServer(r, newFakeServer())
	ws.Register("/v", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	if err := r.ex.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h, _ := ws.WebhookMux().Handler(httptest.NewRequest(http.MethodPost, "/v", nil))
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v", strings.NewReader(review("ns", "x"))))
	if rec.Code != http.StatusTeapot {
		t.Errorf("a request after the drain began got %d, want the handler's answer", rec.Code)
	}
}

// A stop with no delay and no webhook server, and nothing pending, logs nothing.
func TestStopWithoutDelayIsQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &lines{}
		r := newRunnable(withDefaults(Options{Logger: logs.logger()}), false)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if m := logs.messages(); len(m) != 0 {
			t.Errorf("log = %q, want nothing at verbosity 0", m)
		}
	})
}

// A stop that waits for calls tells its whole timeline at the default verbosity, from its
// first line on, and the drain's reports say how long after the stop's beginning they come.
func TestStopWithPendingCallsLogsItsTimeline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &lines{}
		r := newRunnable(withDefaults(Options{Logger: logs.logger(), ReportAfter: time.Second}), false)
		if err := r.ex.Go(context.Background(), "job", func(context.Context) error {
			time.Sleep(1500 * time.Millisecond) // a call that takes a while (fake time)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		want := []string{"Stop began", "Draining executor", "Waiting for pending calls", "All calls returned"}
		if m := logs.messages(); !slices.Equal(m, want) {
			t.Errorf("log = %q, want %q", m, want)
		}
		if l := logs.line("Waiting for pending calls"); !strings.Contains(l, `"sinceStop"="1s"`) {
			t.Errorf("report = %s, want sinceStop 1s", l)
		}
	})
}

func TestDefaultCancelAfter(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want time.Duration // when the drain cancels a call, after it began
	}{
		{Options{GracePeriod: 10 * time.Second}, 8 * time.Second},
		{Options{}, 20 * time.Second},
		{Options{GracePeriod: 10 * time.Second, CancelAfter: drain.CancelAtOnce}, 0}, // controller-runtime's "at once"
		{Options{GracePeriod: 10 * time.Second, CancelAfter: 3 * time.Second}, 3 * time.Second},
	} {
		synctest.Test(t, func(t *testing.T) {
			r := newRunnable(withDefaults(tc.opts), false)
			cancelled := make(chan time.Time, 1)
			if err := r.ex.Go(context.Background(), "job", func(ctx context.Context) error {
				<-ctx.Done()
				cancelled <- time.Now()
				return ctx.Err()
			}); err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			stop()
			begin := time.Now()
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if got := (<-cancelled).Sub(begin); got != tc.want {
				t.Errorf("%+v: the call was cancelled %v after the drain began, want %v", tc.opts, got, tc.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	const notLoopback = "set a loopback host:port"
	for _, tc := range []struct {
		opts Options
		mo   managerOptions
		want string // in the error; "" for none
	}{
		{Options{}, managerOptions{}, ""},
		{Options{ShutdownDelay: -time.Second}, managerOptions{}, "ShutdownDelay is -1s: set it to 0"},
		{Options{GracePeriod: 10 * time.Second, CancelAfter: 10 * time.Second}, managerOptions{},
			"CancelAfter (10s) must be below GracePeriod (10s): lower CancelAfter, or raise GracePeriod"},
		{Options{CancelAfter: 30 * time.Second}, managerOptions{}, "CancelAfter (30s) must be below GracePeriod (25s)"},
		{Options{CancelAfter: -1}, managerOptions{}, ""},
		{Options{GracePeriod: 40 * time.Second}, managerOptions{}, "GracePeriod (40s) must be below the manager's " +
			"GracefulShutdownTimeout (30s, controller-runtime's default, as the manager's Options set none): " +
			"raise the manager's GracefulShutdownTimeout above 40s"},
		{Options{GracePeriod: 30 * time.Second}, managerOptions{}, "GracePeriod (30s) must be below"},
		// The delay comes before the manager's stop (StopContext): not in its budget.
		{Options{ShutdownDelay: 10 * time.Second}, managerOptions{}, ""},
		{Options{GracePeriod: 8 * time.Second}, managerOptions{GracefulShutdownTimeout: ptr.To(4 * time.Second)},
			"GracefulShutdownTimeout (4s, from the manager's Options)"},
		{Options{GracePeriod: time.Hour}, managerOptions{GracefulShutdownTimeout: ptr.To(time.Duration(-1))}, ""},
		// The least intervals (issue 43): each report captures every goroutine's stack.
		{Options{ReportAfter: time.Nanosecond}, managerOptions{}, "ReportAfter is 1ns: set it to 0 (the default) or at least 100ms"},
		{Options{ReportEvery: 499 * time.Millisecond}, managerOptions{}, "ReportEvery is 499ms: set it to 0 (the default) or at least 500ms"},
		{Options{SlowAfter: time.Millisecond}, managerOptions{}, "SlowAfter is 1ms: set it to 0 (the default) or at least 1s"},
		{Options{ReportAfter: drain.MinReportAfter, ReportEvery: drain.MinReportEvery, SlowAfter: drain.MinSlowAfter}, managerOptions{}, ""},
		{Options{SlowAfter: -1}, managerOptions{}, ""}, // never
		{Options{DebugAddress: "127.0.0.1:8083"}, managerOptions{}, ""},
		{Options{DebugAddress: "[::1]:8083"}, managerOptions{}, ""},
		{Options{DebugAddress: "localhost:8083"}, managerOptions{}, ""},
		{Options{DebugAddress: ":8083"}, managerOptions{}, `DebugAddress is ":8083": set a loopback host:port`},
		{Options{DebugAddress: "0.0.0.0:8083"}, managerOptions{}, notLoopback},
		{Options{DebugAddress: "10.0.0.1:8083"}, managerOptions{}, notLoopback},
		{Options{DebugAddress: "pod.example.com:8083"}, managerOptions{}, notLoopback},
		{Options{DebugAddress: "127.0.0.1"}, managerOptions{}, notLoopback},
		// Bound by BindFlags: the errors name the flags, which the user set.
		{Options{ShutdownDelay: -time.Second, flagsBound: true}, managerOptions{},
			"--quiesce-shutdown-delay (ShutdownDelay) is -1s: set it to 0"},
		{Options{GracePeriod: 10 * time.Second, CancelAfter: 10 * time.Second, flagsBound: true}, managerOptions{},
			"--quiesce-cancel-after (CancelAfter) (10s) must be below --quiesce-grace-period (GracePeriod) (10s): " +
				"lower --quiesce-cancel-after (CancelAfter), or raise --quiesce-grace-period (GracePeriod)"},
		{Options{GracePeriod: 30 * time.Second, flagsBound: true}, managerOptions{}, "--quiesce-grace-period (GracePeriod) (30s) must be " +
			"below the manager's GracefulShutdownTimeout"},
	} {
		err := checkDurations(tc.opts)
		if err == nil {
			err = checkBudget(tc.opts, &tc.mo)
		}
		if err == nil {
			err = checkDebugAddress(tc.opts)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want nil", tc.opts, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error with %q", tc.opts, err, tc.want)
		}
	}
}

var _ webhook.Server = (*fakeServer)(nil)

type managerOptions = manager.Options

// wrapServer wraps inner for r, as Setup does, and marks r added, as Runnable.Add does.
func wrapServer(r *Runnable, inner webhook.Server) *webhookServer {
	if r.setup == nil {
		r.setup = &setupState{}
	}
	r.setup.added.Store(true)
	r.setup.attached.Store(true) // as Add does: Start refuses a Runnable of Setup that Add did not add
	return &webhookServer{Server: inner, r: r}
}

// A Logger that panics on the timeline's lines neither crashes the process nor holds the
// manager's stop: StopContext still ends the manager's context after the delay.
func TestStopContextWithAPanickingLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := funcr.New(func(string, string) { panic("broken logger") }, funcr.Options{})
		r := newRunnable(withDefaults(Options{ShutdownDelay: time.Second, Logger: log}), false)
		sig, sigterm := context.WithCancel(context.Background())
		ctx := r.StopContext(sig)
		begin := time.Now()
		sigterm()
		<-ctx.Done()
		if took := time.Since(begin); took != time.Second {
			t.Errorf("the manager's context ended %v after SIGTERM, want the 1s delay", took)
		}
		if !errors.Is(context.Cause(ctx), context.Canceled) {
			t.Errorf("cause = %v, want the signal context's", context.Cause(ctx))
		}
	})
}
