package shutdowntest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Defaults of ServiceOptions.
const (
	DefaultProbePeriod      = 500 * time.Millisecond
	DefaultFailureThreshold = 2
	DefaultTerminatingDelay = time.Second
)

// ServiceOptions say how a Service follows its operators. Zero values mean the defaults
// documented on each field.
type ServiceOptions struct {
	// ProbePeriod is how often the Service probes each operator's /readyz, as a readiness
	// probe's periodSeconds. 0: DefaultProbePeriod (500ms).
	ProbePeriod time.Duration
	// FailureThreshold is how many failing probes in a row take an operator out of the
	// Service, as a readiness probe's failureThreshold; one passing probe puts it back.
	// 0: DefaultFailureThreshold (2).
	FailureThreshold int
	// TerminatingDelay is how long after Stop's SIGTERM the Service sends the operator no new
	// connection, whatever its probes say: the time the endpoints controller and kube-proxy
	// take to act on a terminating pod, during which a pod still gets new connections (what a
	// shutdown delay is for). 0: DefaultTerminatingDelay (1s).
	TerminatingDelay time.Duration
}

// ServiceEvent is an operator joining or leaving a Service's endpoints.
type ServiceEvent struct {
	At       time.Time
	Operator *Operator
	Ready    bool // joined; false: left
}

// Service stands, in a test, for the Kubernetes Service in front of several replicas' webhook
// servers: it listens where the webhook configurations send admission requests and forwards
// each new connection, TLS untouched, to the next ready operator (round robin); an
// established connection stays with its operator until either side closes it, as conntrack
// keeps it. An operator started with Options.Service joins once Start returns (its /readyz
// passed) and leaves at its FailureThreshold-th failing probe in a row (an operator that
// exited fails them) or TerminatingDelay after Stop's SIGTERM, whichever comes first. As
// kube-proxy does, while no operator is ready the Service sends new connections to the
// terminating ones whose probe still passes (a single replica that drains keeps serving its
// webhooks). A connection that finds none, or whose operator refuses it, is closed at once
// (Connections counts it as failed), as a Service without endpoints, or a DNAT to a closed
// port, fails it.
type Service struct {
	ln      net.Listener
	host    string // where the operators' webhook servers listen
	certDir string
	opts    ServiceOptions
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu               sync.Mutex
	endpoints        []*endpoint // in the order added
	next             int
	conns            map[net.Conn]struct{}
	accepted, failed int
	events           []ServiceEvent
}

// endpoint is one operator behind the Service, as an EndpointSlice has it: ready is serving
// and not terminating.
type endpoint struct {
	op          *Operator
	addr        string
	serving     bool // its readiness probe passes
	terminating bool // its stop began
	ready       bool // the last state an event recorded
	failed      int  // failing probes in a row
}

// NewService starts a Service on the address that w's webhook configurations send requests
// to (LocalServingHost:LocalServingPort; e.g. &testEnv.WebhookInstallOptions once the
// Environment started, or options installed with WebhookInstallOptions.Install); the
// operators started with it get w's serving certificate (LocalServingCertDir). Close it.
func NewService(w *envtest.WebhookInstallOptions, opts ServiceOptions) (*Service, error) {
	if w == nil || w.LocalServingPort == 0 || w.LocalServingCertDir == "" {
		return nil, errors.New("invalid webhook options: no LocalServingPort or LocalServingCertDir: " +
			"start the Environment that installs the webhooks first (or call Install on the options)")
	}
	if opts.ProbePeriod <= 0 {
		opts.ProbePeriod = DefaultProbePeriod
	}
	if opts.FailureThreshold <= 0 {
		opts.FailureThreshold = DefaultFailureThreshold
	}
	if opts.TerminatingDelay <= 0 {
		opts.TerminatingDelay = DefaultTerminatingDelay
	}
	addr := net.JoinHostPort(w.LocalServingHost, strconv.Itoa(w.LocalServingPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on the webhooks' address: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		ln: ln, host: w.LocalServingHost, certDir: w.LocalServingCertDir, opts: opts,
		ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{},
	}
	s.wg.Go(s.serve)
	return s, nil
}

// Connections returns how many connections the Service accepted, and how many of them
// failed: no operator was ready, or the one picked refused the connection.
func (s *Service) Connections() (accepted, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.failed
}

// Events returns the operators' joins and leaves so far, in order.
func (s *Service) Events() []ServiceEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ServiceEvent(nil), s.events...)
}

// Close stops listening and probing, closes every connection, and waits for its goroutines.
func (s *Service) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.cancel()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// add puts op, ready, behind the Service, and follows it until it exits.
func (s *Service) add(op *Operator) {
	e := &endpoint{op: op, addr: op.endpoints.Webhook}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return // closed
	}
	s.endpoints = append(s.endpoints, e)
	s.set(e, func() { e.serving = true })
	s.wg.Go(func() { s.probe(e) }) // under s.mu: never after Close's Wait began
}

// set changes e with change, and records an event when that changes whether it is ready.
// Call it with s.mu held.
func (s *Service) set(e *endpoint, change func()) {
	change()
	if ready := e.serving && !e.terminating; ready != e.ready {
		e.ready = ready
		s.events = append(s.events, ServiceEvent{At: time.Now(), Operator: e.op, Ready: ready})
	}
}

// terminating takes op out TerminatingDelay from now, for good.
func (s *Service) terminating(op *Operator) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return // closed
	}
	t := time.NewTimer(s.opts.TerminatingDelay)
	s.wg.Go(func() {
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.ctx.Done():
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, e := range s.endpoints {
			if e.op == op {
				s.set(e, func() { e.terminating = true })
			}
		}
	})
}

// probe probes e's /readyz every ProbePeriod until the probes took out its operator, which
// exited, or the Service closes. An exit takes an operator out as a failing probe does, not
// at once: a Service does not see a process exit.
func (s *Service) probe(e *endpoint) {
	t := time.NewTicker(s.opts.ProbePeriod)
	defer t.Stop()
	url := "http://" + e.op.endpoints.Probe + "/readyz"
	for {
		select {
		case <-t.C:
		case <-s.ctx.Done():
			return
		}
		select {
		case <-e.op.exited:
			s.mu.Lock()
			out := !e.serving
			s.mu.Unlock()
			if out {
				return
			}
		default:
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.ProbePeriod)
		_, status, err := get(ctx, e.op.http, url, "")
		cancel()
		ok := err == nil && status == http.StatusOK
		s.mu.Lock()
		s.set(e, func() {
			if ok {
				e.failed, e.serving = 0, true
			} else if e.failed++; e.failed >= s.opts.FailureThreshold {
				e.serving = false
			}
		})
		s.mu.Unlock()
	}
}

// pick returns the address of the next ready operator; with none, of the next terminating
// one still serving, as kube-proxy falls back to them; or "".
func (s *Service) pick() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ok := range []func(*endpoint) bool{
		func(e *endpoint) bool { return e.ready },
		func(e *endpoint) bool { return e.serving },
	} {
		for range s.endpoints {
			e := s.endpoints[s.next%len(s.endpoints)]
			s.next++
			if ok(e) {
				return e.addr
			}
		}
	}
	return ""
}

func (s *Service) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		s.wg.Go(func() { s.forward(c) })
	}
}

// forward copies c to and from an operator until either side closes.
func (s *Service) forward(c net.Conn) {
	defer func() { _ = c.Close() }()
	var up net.Conn
	err := errors.New("no ready operator")
	if addr := s.pick(); addr != "" {
		var d net.Dialer
		up, err = d.DialContext(s.ctx, "tcp", addr)
	}
	s.mu.Lock()
	s.accepted++
	if err != nil {
		s.failed++
	}
	s.mu.Unlock()
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	if !s.track(c, up) {
		return
	}
	defer s.untrack(c, up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); done <- struct{}{} }
	go cp(up, c)
	go cp(c, up)
	<-done // one side closed: close both, which ends the other copy
	_ = c.Close()
	_ = up.Close()
	<-done
}

// track records conns for Close, unless the Service closed.
func (s *Service) track(conns ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return false
	}
	for _, c := range conns {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *Service) untrack(conns ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range conns {
		delete(s.conns, c)
	}
}
