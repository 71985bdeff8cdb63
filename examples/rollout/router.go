package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// router models a Service in front of the replicas' webhook servers, at the TCP level (the
// TLS stays end to end): each new connection goes to the next replica in the pool, round
// robin, and is then left alone, as conntrack leaves an established connection alone. Like a
// kubelet, it probes each replica's /readyz every probePeriod; a replica joins the pool at
// its first passing probe and leaves it at its second failing probe in a row, the moment the
// endpoints controller and kube-proxy would take to follow. With no replica in the pool, a
// new connection is closed at once, as a Service without endpoints rejects it.
type router struct {
	ln     net.Listener
	events func(replica string, inPool bool) // called when a replica joins or leaves the pool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	pool  []*backend // the replicas, in the order added
	next  int
	conns map[net.Conn]struct{}
	// Connections accepted, and those that failed: no replica in the pool, or the one
	// picked refused (its process stopped listening).
	accepted, failed int
}

type backend struct {
	name, addr, readyz string
	inPool             bool
	failed             int // failing probes in a row
}

// probePeriod is the router's readiness probe period (a kubelet's periodSeconds).
const probePeriod = 500 * time.Millisecond

// newRouter listens on addr. Close it.
func newRouter(addr string, events func(replica string, inPool bool)) (*router, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &router{ln: ln, events: events, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	r.wg.Go(r.serve)
	return r, nil
}

// add routes to the replica serving webhooks at addr once its readyz URL passes.
func (r *router) add(name, addr, readyz string) {
	b := &backend{name: name, addr: addr, readyz: readyz}
	r.mu.Lock()
	r.pool = append(r.pool, b)
	r.mu.Unlock()
	r.wg.Go(func() { r.probe(b) })
}

func (r *router) probe(b *backend) {
	t := time.NewTicker(probePeriod)
	defer t.Stop()
	for {
		ok := ready(r.ctx, b.readyz)
		r.mu.Lock()
		changed := false
		switch {
		case ok:
			b.failed = 0
			changed, b.inPool = !b.inPool, true
		default:
			b.failed++
			if b.failed >= 2 && b.inPool {
				changed, b.inPool = true, false
			}
		}
		in := b.inPool
		r.mu.Unlock()
		if changed {
			r.events(b.name, in)
		}
		select {
		case <-t.C:
		case <-r.ctx.Done():
			return
		}
	}
}

// probeClient does not keep connections alive, as a kubelet's prober.
var probeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// ready reports whether a GET of url answers 200 within the probe period.
func ready(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, probePeriod)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// pick returns the next replica in the pool, or nil.
func (r *router) pick() *backend {
	r.mu.Lock()
	defer r.mu.Unlock()
	for range r.pool {
		b := r.pool[r.next%len(r.pool)]
		r.next++
		if b.inPool {
			return b
		}
	}
	return nil
}

func (r *router) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		r.wg.Go(func() { r.forward(c) })
	}
}

// forward copies c to and from a replica until either side closes.
func (r *router) forward(c net.Conn) {
	defer func() { _ = c.Close() }()
	b := r.pick()
	var up net.Conn
	err := errors.New("no replica in the pool")
	if b != nil {
		var d net.Dialer
		up, err = d.DialContext(r.ctx, "tcp", b.addr)
	}
	r.mu.Lock()
	r.accepted++
	if err != nil {
		r.failed++ // as a Service's DNAT to a closed port: the connection fails
	}
	r.mu.Unlock()
	if err != nil {
		return
	}
	defer func() { _ = up.Close() }()
	if !r.track(c, up) {
		return
	}
	defer r.untrack(c, up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) { _, _ = io.Copy(dst, src); done <- struct{}{} }
	go cp(up, c)
	go cp(c, up)
	<-done // one side closed: close both, which ends the other copy
	_ = c.Close()
	_ = up.Close()
	<-done
}

func (r *router) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return false
	}
	for _, c := range conns {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *router) untrack(conns ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range conns {
		delete(r.conns, c)
	}
}

// counts returns how many connections it accepted and how many of them failed.
func (r *router) counts() (accepted, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.failed
}

// Close stops listening and probing, closes every connection, and waits for its goroutines.
func (r *router) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	r.cancel()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
