package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// The stop's line budget (issue 24): with docs/operating.md's manifest (ShutdownDelay 5s, a
// readiness probe every 2 seconds) and nothing hanging, one replica's whole stop logs at most
// this many lines, quiesce's and controller-runtime's together.
const (
	maxStopLines      = 30
	readmeDelay       = 5 * time.Second
	readmeProbePeriod = 2 * time.Second // periodSeconds: 2, failureThreshold: 1
)

// TestStopLogsLittle: one replica of the operator with a shutdown delay and nothing in
// flight, its /readyz probed as a kubelet probes it with the settings of docs/operating.md. Its stop,
// from SIGTERM to its exit, logs a fixed number of lines and, per failed probe,
// controller-runtime's "healthz check failed": one line at the default verbosity, two at
// V(1) (kubebuilder's scaffold logs at debug level: zap's Development mode), the second one
// with the check's name and quiesce's reason. The test runs a shorter delay than the
// docs' delay, to be fast, and counts the lines of the failed probes that docs/operating.md's delay
// would make: the total stays within maxStopLines.
func TestStopLogsLittle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		perProbe int // "healthz check failed" lines per failed probe
	}{
		{"info", nil, 1},
		{"debug", []string{"--zap-log-level=debug"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) { testStopLogsLittle(t, "stoplog-"+tc.name, tc.perProbe, tc.args...) })
	}
}

func testStopLogsLittle(t *testing.T, ns string, perProbe int, args ...string) {
	const delay = 2 * time.Second
	ctx := t.Context()
	op := startStopLogReplica(t, environment(t), ns, delay, args...)
	// Its start is over: the controller's workers run (the stop's lines come after).
	waitCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := op.WaitLines(waitCtx, 1, func(l string) bool { return strings.Contains(l, "Starting workers") }); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	var failedProbes int
	wg.Go(func() { failedProbes = probe(ctx, op, shutdowntest.DefaultProbePeriod) }) // the Service's, shorter: the short delay sees a few failures
	before := len(op.Lines())
	res, err := op.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if res.ExitCode != 0 || res.Killed {
		t.Fatalf("exit code %d (killed: %t), want 0: nothing hangs", res.ExitCode, res.Killed)
	}
	stop := res.Lines[before:]
	healthz, reasons := 0, 0
	kinds := make([]string, 0, len(stop))
	for _, l := range stop {
		var e struct{ Logger, Msg, Checker, Error string }
		_ = json.Unmarshal([]byte(l), &e) // an unreadable line counts too, unnamed
		if e.Msg == "healthz check failed" {
			healthz++
			if e.Checker == "quiesce" && strings.Contains(e.Error, "readiness fails for the 2s shutdown delay") {
				reasons++
			}
		}
		kinds = append(kinds, e.Logger+": "+e.Msg)
	}
	t.Logf("the stop: exit %d %s after SIGTERM, %d failed probes, %d lines (%d of them \"healthz check failed\"):\n\t%s",
		res.ExitCode, res.Took.Round(time.Millisecond), failedProbes, len(stop), healthz, strings.Join(kinds, "\n\t"))
	if failedProbes == 0 {
		t.Fatal("no probe failed during the delay")
	}
	if healthz > perProbe*failedProbes {
		t.Errorf("%d \"healthz check failed\" lines for %d failed probes, want at most %d each",
			healthz, failedProbes, perProbe)
	}
	if perProbe > 1 && reasons == 0 {
		t.Errorf("no V(1) \"healthz check failed\" line gives quiesce's reason")
	}
	// With docs/operating.md's delay: the same lines but for the probes', and those of as many
	// failed probes as fit in the delay.
	probes := int((readmeDelay + readmeProbePeriod - 1) / readmeProbePeriod)
	if n := len(stop) - healthz + perProbe*probes; n > maxStopLines {
		t.Errorf("the stop logs %d lines, %d of them for failed probes; with the docs' %s delay, %d failed probes "+
			"would make it %d lines, want at most %d", len(stop), healthz, readmeDelay, probes, n, maxStopLines)
	}
}

// startStopLogReplica starts one replica of the operator, with quiesce and delay, in a
// namespace of its own; its webhook server listens on a free port of its own.
func startStopLogReplica(
	t *testing.T, env *envtest.Environment, ns string, delay time.Duration, args ...string,
) *shutdowntest.Operator {
	t.Helper()
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	op, err := shutdowntest.Start(t.Context(), shutdowntest.Options{
		Package: operatorPackage,
		Dir:     moduleRoot,
		Env:     env,
		// The webhook configuration points at the rollout's Service; the test creates no ConfigMap.
		FreeWebhookPort: true,
		Flags: func(e shutdowntest.Endpoints) []string {
			host, port, _ := net.SplitHostPort(e.Webhook)
			return []string{"--id=stoplog", "--webhook-host=" + host, "--webhook-port=" + port,
				"--cert-dir=" + e.WebhookCertDir, "--health-probe-bind-address=" + e.Probe,
				"--metrics-bind-address=" + e.Metrics} // as docs/operating.md's manifest: its stop logs a line too
		},
		Args: append([]string{"--namespace=" + ns, "--shutdown-delay=" + delay.String(), "--grace-period=5s"},
			args...),
		ReadyTimeout: startTimeout,
		StopTimeout:  delay + 5*time.Second + exitMargin,
		Output:       t.Output(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Kill)
	return op
}

// probe GETs op's /readyz every period, as a kubelet's readiness probe does, until op exits
// or ctx ends, and returns how many probes failed.
func probe(ctx context.Context, op *shutdowntest.Operator, period time.Duration) int {
	t := time.NewTicker(period)
	defer t.Stop()
	url := "http://" + op.Endpoints().Probe + "/readyz"
	failed := 0
	for {
		select {
		case <-op.Done():
			return failed
		case <-ctx.Done():
			return failed
		case <-t.C:
		}
		if !ready(ctx, url, period) {
			failed++
		}
	}
}

// ready reports whether a GET of url answers 200 within timeout.
func ready(ctx context.Context, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
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

// probeClient does not keep connections alive, as a kubelet's prober.
var probeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
