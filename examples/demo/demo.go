package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/examples/internal/runner"
	"github.com/quiesce-dev/quiesce/runnable"
	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// Names shared with examples/demo-operator.
const (
	operatorPackage    = "./examples/demo-operator"
	namespace          = "demo"
	labelKey           = "demo"
	labelValue         = "quiesce"
	snapshotAnnotation = "quiesce.dev/snapshot"
	startedMessage     = "Handler started"
)

// How long the demo waits for things that take no time on an idle machine.
const (
	startTimeout = time.Minute      // from the operator's start to every handler started
	exitMargin   = 30 * time.Second // beyond the operator's own shutdown timeout
	fetchTimeout = 10 * time.Second // for the GET of /debug/quiesce
)

// config is the demo's scenario. Zero fields take defaults (see setDefaults).
type config struct {
	GracePeriod time.Duration // the operator's --grace-period; default 6s
	Work        time.Duration // how long the finishing handler works; default GracePeriod/3
	CancelAfter time.Duration // default halfway between Work and GracePeriod
	ReportEvery time.Duration // default GracePeriod/3
	Objects     int           // ConfigMaps to create; default 3
	Hanging     int           // how many of them hang; may be 0
	// SecondSignal, if > 0, is when after the first SIGTERM a second one is sent, if the
	// operator still runs: it then exits at once with code 1, without finishing its drain.
	SecondSignal time.Duration
	Operator     string    // a demo-operator binary; empty: build one
	Out          io.Writer // the demo's narration and the operator's log; nil: discard
}

func (c *config) setDefaults() error {
	if c.GracePeriod <= 0 {
		c.GracePeriod = 6 * time.Second
	}
	if c.Work <= 0 {
		c.Work = c.GracePeriod / 3
	}
	if c.CancelAfter <= 0 {
		c.CancelAfter = c.Work + (c.GracePeriod-c.Work)/2
	}
	if c.ReportEvery <= 0 {
		c.ReportEvery = c.GracePeriod / 3
	}
	if c.Objects <= 0 {
		c.Objects = 3
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	switch {
	case c.Hanging < 0 || c.Hanging > c.Objects:
		return fmt.Errorf("invalid scenario: --hanging=%d must be between 0 and --objects=%d", c.Hanging, c.Objects)
	case c.Work >= c.CancelAfter || c.CancelAfter >= c.GracePeriod:
		return fmt.Errorf("invalid scenario: need --work (%s) < --cancel-after (%s) < --grace-period (%s), "+
			"so that the finishing handlers finish within the grace period", c.Work, c.CancelAfter, c.GracePeriod)
	}
	return nil
}

// operatorArgs are the operator's flags for the scenario, beside those of its servers.
func (c *config) operatorArgs() []string {
	return []string{
		"--grace-period=" + c.GracePeriod.String(),
		"--report-after=" + min(time.Second, c.ReportEvery).String(),
		"--report-every=" + c.ReportEvery.String(),
		"--cancel-after=" + c.CancelAfter.String(),
		"--work=" + c.Work.String(),
		// One worker per object: each handler starts at once, the hanging one included.
		"--max-concurrent-reconciles=" + strconv.Itoa(c.Objects),
	}
}

// result is what happened.
type result struct {
	Hanging   []string // the ConfigMaps whose handler hangs
	Finishing []string // the others
	Lines     []string // the operator's log, stdout and stderr
	ExitCode  int      // the operator's; -1 if a signal killed it
	SignalAt  time.Time
	Second    bool                 // a second SIGTERM was sent
	ExitAfter time.Duration        // from SIGTERM to the operator's exit
	Snapshots map[string]time.Time // ConfigMap name → when its snapshot was recorded
	Debug     []byte               // the body of /debug/quiesce, fetched before SIGTERM
}

// expectedExitCode is the operator's exit code when things go as designed: 1 when a
// handler hangs, since the runnable abandons it; 0 when every call returns.
func (r *result) expectedExitCode() int {
	if len(r.Hanging) > 0 || r.Second {
		return 1
	}
	return 0
}

// check returns an error unless the demo went as expected: the operator exited with its
// expected code, and every finishing handler recorded its snapshot after SIGTERM (it
// finished within the grace period instead of failing with "context canceled"), unless a
// second SIGTERM cut the drain short.
func (r *result) check() error {
	var errs []error
	if want := r.expectedExitCode(); r.ExitCode != want {
		errs = append(errs, fmt.Errorf("the operator exited with code %d, expected %d", r.ExitCode, want))
	}
	if r.Second {
		return errors.Join(errs...)
	}
	for _, name := range r.Finishing {
		at, ok := r.Snapshots[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s: no snapshot recorded", name))
		case at.Before(r.SignalAt):
			errs = append(errs, fmt.Errorf("%s: snapshot recorded before SIGTERM: "+
				"the demo signalled too late to show a handler finishing during the drain", name))
		}
	}
	return errors.Join(errs...)
}

func (r *result) summary() string {
	if r.Second {
		return fmt.Sprintf("the operator exited with code %d as expected, %s after the first SIGTERM: "+
			"the second one cut its drain short", r.ExitCode, r.ExitAfter.Round(10*time.Millisecond))
	}
	return fmt.Sprintf("the operator exited with code %d as expected: %d handler(s) finished after SIGTERM, %d abandoned",
		r.ExitCode, len(r.Finishing), len(r.Hanging))
}

// run plays the scenario: control plane, operator, objects, SIGTERM, exit. It returns an
// error when the demo could not run; whether it went as expected is result.check's call.
// Whatever happens, it leaves no process running. The binary it builds stays, for the next
// run in the process, until shutdowntest.Cleanup.
func run(ctx context.Context, cfg config) (res result, err error) {
	if err := cfg.setDefaults(); err != nil {
		return res, err
	}
	out := &runner.SyncWriter{W: cfg.Out}
	say := func(format string, args ...any) {
		_, _ = fmt.Fprintf(out, "==> "+format+"\n", args...) // nowhere to report a failed write to
	}

	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return res, errors.New("KUBEBUILDER_ASSETS is not set: run `make demo`, " +
			"or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	// Build the operator while the control plane starts (shutdowntest builds once per process).
	bin := cfg.Operator
	built := make(chan error, 1)
	if bin == "" {
		root, err := runner.ModuleRoot(ctx)
		if err != nil {
			return res, err
		}
		build := shutdowntest.Options{Package: operatorPackage, Dir: root}
		say("building the operator: go build %s (in %s)", operatorPackage, root)
		go func() {
			var err error
			bin, err = shutdowntest.Build(ctx, build)
			built <- err
		}()
	} else {
		built <- nil
	}
	buildErr := func() error { // waits for the build, once
		err, ok := <-built
		if ok {
			close(built)
		}
		return err
	}
	defer func() { _ = buildErr() }() // on an early return, wait for the build; its error no longer matters

	say("starting the control plane: kube-apiserver and etcd from %s", assets)
	env := &envtest.Environment{}
	restCfg, err := env.Start()
	if err != nil {
		return res, fmt.Errorf("failed to start the control plane: %w", err)
	}
	defer func() {
		say("stopping the control plane")
		if stopErr := env.Stop(); stopErr != nil && err == nil {
			err = fmt.Errorf("failed to stop the control plane: %w", stopErr)
		}
	}()
	c, err := client.New(restCfg, client.Options{})
	if err != nil {
		return res, fmt.Errorf("failed to create a client: %w", err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return res, fmt.Errorf("failed to create namespace %s: %w", namespace, err)
	}

	if err := buildErr(); err != nil {
		return res, err
	}
	// The operator gets a kubeconfig of its own, as it would in a cluster, and its metrics
	// server, probes and quiesce's debug listener (/debug/quiesce) on free loopback ports.
	op, err := shutdowntest.Start(ctx, shutdowntest.Options{
		Binary: bin,
		Env:    env,
		Flags: func(e shutdowntest.Endpoints) []string { // called once, just before the start
			// The demo operator has no --metrics-secure: its metrics server serves plain HTTP.
			flags := []string{"--metrics-bind-address=" + e.Metrics, "--health-probe-bind-address=" + e.Probe,
				"--quiesce-debug-address=" + e.Debug}
			say("starting the operator: %s %s",
				filepath.Base(bin), strings.Join(append(flags, cfg.operatorArgs()...), " "))
			return flags
		},
		Args:         cfg.operatorArgs(),
		ReadyTimeout: startTimeout,
		// The operator's manager waits GracePeriod+2s at most (see examples/demo-operator).
		StopTimeout: cfg.GracePeriod + 2*time.Second + exitMargin,
		Output:      out,
	})
	if err != nil {
		return res, err
	}
	defer op.Kill() // on any early return; a no-op once it exited

	if err := createObjects(ctx, c, cfg, &res); err != nil {
		return res, err
	}
	say("created ConfigMaps in namespace %q labelled %s=%s: %s (handler snapshot: finishes in %s), "+
		"%s (handler legacy-export: hangs, ignoring its context)",
		namespace, labelKey, labelValue, listOrNone(res.Finishing), cfg.Work, listOrNone(res.Hanging))

	if err := waitFor(ctx, op, startedMessage, cfg.Objects); err != nil {
		return res, err
	}
	// The debug listener listens from before the manager's start: no need to wait for it.
	url := "http://" + op.Endpoints().Debug + runnable.DebugPath
	if res.Debug, err = fetch(ctx, url); err != nil {
		return res, err
	}
	// The narration and the JSON in one write, so that no log line of the operator splits them.
	_, _ = fmt.Fprintf(out, "==> all %d handlers started; GET %s (quiesce's debug listener, on loopback "+
		"only) lists its pending calls, where each waits and its handler's line:\n%s\n",
		cfg.Objects, url, indent(res.Debug))
	say("sending SIGTERM to the operator (pid %d); it has %s to finish (contexts cancelled at %s)",
		op.Pid(), cfg.GracePeriod, cfg.CancelAfter)

	stopped, err := stop(ctx, op, cfg, &res, say)
	if err != nil {
		return res, err
	}
	res.ExitAfter = stopped.Took
	res.Lines = stopped.Lines
	res.ExitCode = stopped.ExitCode
	say("the operator exited with code %d, %s after SIGTERM (exit status %d)",
		res.ExitCode, res.ExitAfter.Round(10*time.Millisecond), res.ExitCode)

	if err := collectSnapshots(ctx, c, &res, say); err != nil {
		return res, err
	}
	return res, nil
}

// createObjects creates the scenario's ConfigMaps, recording their names in res.
func createObjects(ctx context.Context, c client.Client, cfg config, res *result) error {
	for i := range cfg.Objects - cfg.Hanging {
		res.Finishing = append(res.Finishing, fmt.Sprintf("job-%d", i+1))
	}
	for i := range cfg.Hanging {
		res.Hanging = append(res.Hanging, fmt.Sprintf("hang-%d", i+1))
	}
	for _, name := range append(append([]string(nil), res.Finishing...), res.Hanging...) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: namespace, Labels: map[string]string{labelKey: labelValue},
		}}
		if err := c.Create(ctx, cm); err != nil {
			return fmt.Errorf("failed to create ConfigMap %s/%s: %w", namespace, name, err)
		}
	}
	return nil
}

// stop sends the operator SIGTERM (at res.SignalAt) and waits for it to exit, sending it the
// second SIGTERM of the scenario if there is one.
func stop(
	ctx context.Context, op *shutdowntest.Operator, cfg config, res *result, say func(string, ...any),
) (*shutdowntest.Result, error) {
	fired := make(chan struct{})
	second := time.AfterFunc(max(cfg.SecondSignal, 0), func() {
		defer close(fired)
		if cfg.SecondSignal <= 0 {
			return
		}
		say("sending a second SIGTERM, %s after the first: the operator exits at once", cfg.SecondSignal)
		res.Second = op.Signal(syscall.SIGTERM) == nil // exited already: not sent
	})
	res.SignalAt = time.Now()
	stopped, err := op.Stop(ctx)
	if !second.Stop() {
		<-fired // res.Second is set
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("interrupted while the operator drained: %w", ctx.Err())
	case err != nil:
		return nil, err
	case stopped.Killed:
		return nil, fmt.Errorf("the operator did not exit within %s of SIGTERM", cfg.GracePeriod+2*time.Second+exitMargin)
	}
	return stopped, nil
}

// collectSnapshots records in res.Snapshots what the finishing handlers left in the cluster.
func collectSnapshots(ctx context.Context, c client.Client, res *result, say func(string, ...any)) error {
	res.Snapshots = map[string]time.Time{}
	for _, name := range append(append([]string(nil), res.Finishing...), res.Hanging...) {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &cm); err != nil {
			return fmt.Errorf("failed to get ConfigMap %s/%s: %w", namespace, name, err)
		}
		v, ok := cm.Annotations[snapshotAnnotation]
		if !ok {
			say("%s: no snapshot recorded", name)
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return fmt.Errorf("failed to parse annotation %s of %s: %w", snapshotAnnotation, name, err)
		}
		res.Snapshots[name] = at
		say("%s: snapshot recorded %s after SIGTERM", name, at.Sub(res.SignalAt).Round(10*time.Millisecond))
	}
	return nil
}

// fetch GETs url and returns its body, an error unless it is 200 OK with a JSON body.
func fetch(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("failed to create the request for %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("failed to get %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below, or failed: nothing to lose
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("failed to read the body of %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("failed to get %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	if !json.Valid(body) {
		return nil, fmt.Errorf("failed to get %s: the body is not JSON: %q", url, body)
	}
	return body, nil
}

// indent returns the JSON body b indented, for a person to read.
func indent(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Indent(&buf, bytes.TrimSpace(b), "", "  "); err != nil {
		return b // fetch checked it is JSON; as it came, otherwise
	}
	return buf.Bytes()
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// waitFor waits until n lines of the operator's log contain substr, up to startTimeout.
func waitFor(ctx context.Context, op *shutdowntest.Operator, substr string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := op.WaitLines(ctx, n, func(l string) bool { return strings.Contains(l, substr) }); err != nil {
		return fmt.Errorf("waiting for %d log lines saying %q: %w", n, substr, err)
	}
	return nil
}
