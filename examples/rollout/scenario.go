package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// How long the runner waits for things that take no time on an idle machine.
const (
	startTimeout = time.Minute
	exitMargin   = 30 * time.Second
)

// scenario is one rollout: two replicas, the leader stopped mid-work.
type scenario struct{ stage }

// play runs the scenario and measures it; it returns an error when it could not run.
func (s *scenario) play(ctx context.Context) (*result, error) {
	mode, ns := s.mode(), "rollout-"+s.mode()
	rt, pool, err := s.setUp(ctx, ns)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rt.Close() }()
	args := s.args(ns, s.cfg.Delay, s.cfg.Work)
	a, err := s.startReplica(ctx, rt, pool, mode+"-a", args, s.cfg.Delay, true)
	if err != nil {
		return nil, err
	}
	defer a.Kill()
	b, err := s.startReplica(ctx, rt, pool, mode+"-b", args, s.cfg.Delay, false)
	if err != nil {
		return nil, err
	}
	defer b.Kill()
	s.say("%s leads, %s stands by, both in the router's pool; creating %d ConfigMap(s) every %s",
		a.name, b.name, s.cfg.Burst, s.cfg.Interval)

	cr := startCreating(ctx, s.c, ns, mode, s.cfg.Interval, s.cfg.Burst)
	finished := false
	defer func() {
		if !finished {
			cr.finish()
		}
	}()
	if err := a.waitFor(ctx, `"done":true`, s.cfg.Before); err != nil {
		return nil, err
	}
	s.say("%s reconciled %d ConfigMaps; sending it SIGTERM", a.name, s.cfg.Before)
	stopped, signalAt, err := a.stop(ctx)
	if err != nil {
		return nil, err
	}
	res := &result{Mode: mode, SignalAt: signalAt, ExitAfter: stopped.Took, ExitCode: stopped.ExitCode}
	s.say("%s exited with code %d, %s after SIGTERM", a.name, res.ExitCode, res.ExitAfter.Round(time.Millisecond))
	if err := b.waitFor(ctx, reconcileEnded, 1); err != nil {
		return nil, err
	}
	select {
	case <-time.After(s.cfg.After):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res.EndAt = time.Now()
	res.Conns, res.ConnsFailed = rt.counts()
	res.creates = cr.finish()
	finished = true
	s.say("stopped creating; waiting for every ConfigMap to be reconciled")
	lost, by, err := waitAllReconciled(ctx, s.c, ns, 30*time.Second)
	if err != nil {
		return nil, err
	}
	res.Lost, res.By = lost, by
	// The new leader's log so far is all the run measures: no need to wait for its stop.
	bLines := b.Lines()
	b.Kill()
	res.measure(entries(stopped.Lines), entries(bLines), pool.between(res.SignalAt, res.EndAt))
	for _, l := range res.Story() {
		s.say("%s", l)
	}
	return res, nil
}

// poolLog records the router's pool changes.
type poolLog struct {
	mu      sync.Mutex
	events  []poolEvent
	changed chan struct{}
}

type poolEvent struct {
	At      time.Time
	Replica string
	In      bool
}

func (p *poolLog) record(replica string, in bool) {
	p.mu.Lock()
	p.events = append(p.events, poolEvent{At: time.Now(), Replica: replica, In: in})
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

func (p *poolLog) between(from, to time.Time) []poolEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(p.events), func(e poolEvent) bool { return e.At.Before(from) || e.At.After(to) })
}

// waitIn waits until replica joined the pool.
func (p *poolLog) waitIn(ctx context.Context, replica string) error {
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		in := slices.ContainsFunc(p.events, func(e poolEvent) bool { return e.Replica == replica && e.In })
		p.mu.Unlock()
		if in {
			return nil
		}
		select {
		case <-p.changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.New("timed out waiting for " + replica + " to pass its readiness probe")
		}
	}
}
