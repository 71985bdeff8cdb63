package main

import (
	"context"
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
	svc, err := s.setUp(ctx, ns)
	if err != nil {
		return nil, err
	}
	defer func() { _ = svc.Close() }()
	args := s.args(ns, s.cfg.Delay, s.cfg.Work)
	a, err := s.startReplica(ctx, svc, mode+"-a", args, s.cfg.Delay, true)
	if err != nil {
		return nil, err
	}
	defer a.Kill()
	b, err := s.startReplica(ctx, svc, mode+"-b", args, s.cfg.Delay, false)
	if err != nil {
		return nil, err
	}
	defer b.Kill()
	s.say("%s leads, %s stands by, both behind the Service; creating %d ConfigMap(s) every %s",
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
	res.Conns, res.ConnsFailed = svc.Connections()
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
	res.measure(entries(stopped.Lines), entries(bLines), poolEvents(svc, res.SignalAt, res.EndAt, a, b))
	for _, l := range res.Story() {
		s.say("%s", l)
	}
	return res, nil
}
