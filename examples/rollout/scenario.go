package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// How long the runner waits for things that take no time on an idle machine.
const (
	startTimeout = time.Minute
	exitMargin   = 30 * time.Second
)

// scenario is one rollout: two replicas, the leader stopped mid-work.
type scenario struct {
	cfg                                  config
	quiesce                              bool
	bin, kubeconfig, certDir, routerAddr string
	c                                    client.Client
	say                                  func(string, ...any)
}

func (s *scenario) mode() string { return modeOf(s.quiesce) }

func (s *scenario) args(ns string) []string {
	return []string{
		"--quiesce=" + fmt.Sprint(s.quiesce), "--namespace=" + ns, "--cert-dir=" + s.certDir,
		"--grace-period=" + s.cfg.Grace.String(), "--shutdown-delay=" + s.cfg.Delay.String(),
		"--work=" + s.cfg.Work.String(), "--webhook-work=" + s.cfg.WebhookWork.String(),
		"--webhook-http2=" + fmt.Sprint(s.cfg.HTTP2),
	}
}

// play runs the scenario and measures it; it returns an error when it could not run.
func (s *scenario) play(ctx context.Context) (*result, error) {
	mode, ns := s.mode(), "rollout-"+s.mode()
	if err := s.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, fmt.Errorf("failed to create namespace %s: %w", ns, err)
	}
	pool := &poolLog{changed: make(chan struct{}, 1)}
	rt, err := newRouter(s.routerAddr, pool.record)
	if err != nil {
		return nil, fmt.Errorf("failed to start the router: %w", err)
	}
	defer func() { _ = rt.Close() }()

	var logOut io.Writer
	if s.cfg.ShowLogs {
		logOut = s.cfg.Out
	}
	args := s.args(ns)
	s.say("%s run: starting replica %s-a: operator %v", mode, mode, args)
	a, err := startReplica(s.bin, mode+"-a", args, s.kubeconfig, logOut)
	if err != nil {
		return nil, err
	}
	defer a.kill()
	rt.add(a.name, a.webhookAddr, a.readyz)
	if err := a.waitFor(ctx, leaseAcquired, 1); err != nil {
		return nil, err
	}
	if err := pool.waitIn(ctx, a.name); err != nil {
		return nil, err
	}
	b, err := startReplica(s.bin, mode+"-b", args, s.kubeconfig, logOut)
	if err != nil {
		return nil, err
	}
	defer b.kill()
	rt.add(b.name, b.webhookAddr, b.readyz)
	if err := pool.waitIn(ctx, b.name); err != nil {
		return nil, err
	}
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
	res := &result{Mode: mode, SignalAt: time.Now()}
	s.say("%s reconciled %d ConfigMaps; sending it SIGTERM", a.name, s.cfg.Before)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return nil, fmt.Errorf("failed to send SIGTERM to %s: %w", a.name, err)
	}
	select {
	case <-a.exited:
	case <-time.After(s.cfg.Delay + s.cfg.Grace + exitMargin):
		return nil, fmt.Errorf("%s did not exit within %s of SIGTERM", a.name, s.cfg.Delay+s.cfg.Grace+exitMargin)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res.ExitAfter = time.Since(res.SignalAt)
	<-a.logDone
	res.ExitCode = a.cmd.ProcessState.ExitCode()
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
	if err := b.stop(s.cfg.Delay + s.cfg.Grace + exitMargin); err != nil {
		return nil, err
	}
	res.measure(a.entries(), b.entries(), pool.between(res.SignalAt, res.EndAt))
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
