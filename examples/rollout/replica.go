package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// stage is what every run plays on, the rollout and the single-replica case alike: the
// control plane (whose webhook configuration points at the Service's address), the operator's
// binary, a client, the narration.
type stage struct {
	cfg     config
	quiesce bool
	bin     string
	env     *envtest.Environment
	c       client.Client
	say     func(string, ...any)
}

func (s *stage) mode() string { return modeOf(s.quiesce) }

// args are the operator's flags for a run in namespace ns.
func (s *stage) args(ns string, delay, work time.Duration) []string {
	return []string{
		"--quiesce=" + strconv.FormatBool(s.quiesce), "--namespace=" + ns,
		"--grace-period=" + s.cfg.Grace.String(), "--shutdown-delay=" + delay.String(),
		"--work=" + work.String(), "--webhook-work=" + s.cfg.WebhookWork.String(),
		"--webhook-http2=" + strconv.FormatBool(s.cfg.HTTP2),
	}
}

// setUp creates namespace ns and starts the Service where the webhook configuration points.
// Close the Service.
func (s *stage) setUp(ctx context.Context, ns string) (*shutdowntest.Service, error) {
	if err := s.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, fmt.Errorf("failed to create namespace %s: %w", ns, err)
	}
	svc, err := shutdowntest.NewService(&s.env.WebhookInstallOptions, shutdowntest.ServiceOptions{})
	if err != nil {
		return nil, fmt.Errorf("failed to start the Service: %w", err)
	}
	return svc, nil
}

// replica is one operator process, run by shutdowntest behind the Service.
type replica struct {
	*shutdowntest.Operator
	name        string
	stopTimeout time.Duration
}

// startReplica starts a replica of the operator named name with args (its --shutdown-delay
// delay) behind svc, and returns once it is ready, in the Service, and, when lead is set,
// once it acquired the lease. Kill it.
func (s *stage) startReplica(
	ctx context.Context, svc *shutdowntest.Service, name string, args []string, delay time.Duration, lead bool,
) (*replica, error) {
	var out io.Writer
	if s.cfg.ShowLogs {
		out = s.cfg.Out
	}
	s.say("%s run: starting replica %s: operator %s (and its --id, webhook and probe addresses)",
		s.mode(), name, strings.Join(args, " "))
	op, err := shutdowntest.Start(ctx, shutdowntest.Options{
		Binary:  s.bin,
		Env:     s.env,
		Service: svc, // a webhook port of its own, behind the Service
		Flags: func(e shutdowntest.Endpoints) []string {
			host, port, _ := net.SplitHostPort(e.Webhook)
			return []string{"--id=" + name, "--webhook-host=" + host, "--webhook-port=" + port,
				"--cert-dir=" + e.WebhookCertDir, "--health-probe-bind-address=" + e.Probe}
		},
		Args:         args,
		ReadyTimeout: startTimeout,
		StopTimeout:  delay + s.cfg.Grace + exitMargin,
		WaitTimeout:  startTimeout,
		Output:       out,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	rp := &replica{Operator: op, name: name, stopTimeout: delay + s.cfg.Grace + exitMargin}
	if lead {
		if err := rp.WaitLeader(ctx); err != nil {
			rp.Kill()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return rp, nil
}

// waitFor waits until n lines of its log contain substr, for startTimeout at most.
func (rp *replica) waitFor(ctx context.Context, substr string, n int) error {
	err := rp.WaitLines(ctx, n, func(l string) bool { return strings.Contains(l, substr) })
	if err != nil {
		return fmt.Errorf("%s: waiting for %q: %w", rp.name, substr, err)
	}
	return nil
}

// poolEvents returns svc's joins and leaves of replicas between from and to.
func poolEvents(svc *shutdowntest.Service, from, to time.Time, replicas ...*replica) []poolEvent {
	var es []poolEvent
	for _, e := range svc.Events() {
		for _, r := range replicas {
			if r.Operator == e.Operator && !e.At.Before(from) && !e.At.After(to) {
				es = append(es, poolEvent{At: e.At, Replica: r.name, In: e.Ready})
			}
		}
	}
	return es
}

// poolEvent is a replica joining or leaving the Service.
type poolEvent struct {
	At      time.Time
	Replica string
	In      bool
}

// stop sends the replica SIGTERM and waits for its exit; it returns what happened and when
// it sent the signal. An exit forced by the harness (no exit within its stop timeout) is an
// error.
func (rp *replica) stop(ctx context.Context) (*shutdowntest.Result, time.Time, error) {
	at := time.Now()
	res, err := rp.Stop(ctx)
	if err != nil {
		return nil, at, fmt.Errorf("%s: %w", rp.name, err)
	}
	if res.Killed {
		return nil, at, fmt.Errorf("%s did not exit within %s of SIGTERM", rp.name, rp.stopTimeout)
	}
	return res, at, nil
}

// entries returns the lines of log that are JSON objects, decoded, in order.
func entries(log []string) []map[string]any {
	var es []map[string]any
	for _, l := range log {
		var e map[string]any
		if json.Unmarshal([]byte(l), &e) == nil {
			es = append(es, e)
		}
	}
	return es
}
