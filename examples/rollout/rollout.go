package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/examples/internal/runner"
	"github.com/quiesce-dev/quiesce/shutdowntest"
)

// Names shared with examples/rollout/operator.
const (
	operatorPackage = "./examples/rollout/operator"
	labelKey        = "quiesce.dev/rollout"
	doneAnnotation  = "quiesce.dev/reconciled-by"
	reconcileEnded  = "Reconcile ended"
)

// config is the scenario. Zero fields take defaults (see setDefaults).
type config struct {
	Grace    time.Duration // the operators' --grace-period; default 5s
	Delay    time.Duration // the quiesce run's --shutdown-delay; default 2s
	Work     time.Duration // how long a reconcile works; default 200ms
	Interval time.Duration // between two creates (two bursts); default 25ms
	Burst    int           // creates at once, every Interval; default 1
	// WebhookWork is how long the webhook takes to validate; default 20ms.
	WebhookWork time.Duration
	HTTP2       bool // the webhook servers speak HTTP/2 too
	// Before is how many reconciles the first leader finishes before its SIGTERM (default
	// 20); After how long the client keeps creating once the new leader reconciles (1s).
	Before int
	After  time.Duration
	// The single-replica case: SingleObjects ConfigMaps (default 10) whose reconciles work
	// SingleWork each (default 1s) when SIGTERM comes; SkipSingle leaves it out.
	SingleObjects int
	SingleWork    time.Duration
	SkipSingle    bool
	Operator      string // an operator binary; empty: build one
	// Env is a started control plane made by newEnvironment, left running; nil: run starts
	// one and stops it.
	Env      *envtest.Environment
	Out      io.Writer // the narration; nil: discard
	ShowLogs bool      // stream the replicas' logs to Out
}

func (c *config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Grace, 5*time.Second)
	def(&c.Delay, 2*time.Second)
	def(&c.Work, 200*time.Millisecond)
	def(&c.Interval, 25*time.Millisecond)
	def(&c.WebhookWork, 20*time.Millisecond)
	def(&c.After, time.Second)
	def(&c.SingleWork, time.Second)
	if c.SingleObjects <= 0 {
		c.SingleObjects = 10
	}
	if c.Burst <= 0 {
		c.Burst = 1
	}
	if c.Before <= 0 {
		c.Before = 20
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// report is what run measured: the rollouts, then the single-replica runs (quiesce first).
type report struct {
	Rollouts []*result
	Single   []*singleResult
}

// run starts one control plane and plays the rollout with quiesce, then without, then the
// single-replica case with quiesce, then without (unless cfg.SkipSingle).
// Whatever happens, it leaves no process running. The operator's binary (built once per
// process by shutdowntest) stays for a later run until shutdowntest.Cleanup.
func run(ctx context.Context, cfg config) (res *report, err error) {
	cfg.setDefaults()
	out := &runner.SyncWriter{W: cfg.Out}
	cfg.Out = out
	say := func(format string, args ...any) { _, _ = fmt.Fprintf(out, "==> "+format+"\n", args...) }

	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: run `make demo-rollout`, " +
			"or export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh)")
	}
	// Build the operator while the control plane starts.
	root, err := runner.ModuleRoot(ctx)
	if err != nil {
		return nil, err
	}
	bin := cfg.Operator
	built := make(chan error, 1)
	if bin == "" {
		say("building the operator: go build %s (in %s)", operatorPackage, root)
		go func() {
			var err error
			bin, err = shutdowntest.Build(ctx, shutdowntest.Options{Package: operatorPackage, Dir: root})
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

	env := cfg.Env
	if env == nil {
		say("starting the control plane, with a validating webhook on ConfigMaps (failurePolicy: Fail) " +
			"that points at the Service")
		env = newEnvironment(root)
		if _, err := env.Start(); err != nil {
			return nil, fmt.Errorf("failed to start the control plane: %w", err)
		}
		defer func() { err = errors.Join(err, env.Stop()) }()
	}
	restCfg := rest.CopyConfig(env.Config)
	restCfg.QPS, restCfg.Burst = -1, 0 // the client creates at its own pace, unthrottled
	c, err := client.New(restCfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("failed to create a client: %w", err)
	}
	if err := buildErr(); err != nil {
		return nil, err
	}

	res = &report{}
	for _, quiesce := range []bool{true, false} {
		s := &scenario{stage{cfg: cfg, quiesce: quiesce, bin: bin, env: env, c: c, say: say}}
		start := time.Now()
		r, err := s.play(ctx)
		if err != nil {
			return res, fmt.Errorf("%s run: %w", s.mode(), err)
		}
		s.say("%s run: played in %s", s.mode(), time.Since(start).Round(time.Millisecond))
		res.Rollouts = append(res.Rollouts, r)
	}
	if cfg.SkipSingle {
		return res, nil
	}
	for _, quiesce := range []bool{true, false} {
		s := &single{stage{cfg: cfg, quiesce: quiesce, bin: bin, env: env, c: c, say: say}}
		start := time.Now()
		r, err := s.play(ctx)
		if err != nil {
			return res, fmt.Errorf("%s single-replica run: %w", s.mode(), err)
		}
		s.say("%s single-replica run: played in %s", s.mode(), time.Since(start).Round(time.Millisecond))
		res.Single = append(res.Single, r)
	}
	return res, nil
}

// webhookManifest is the operator's webhook configuration, relative to the module's root.
const webhookManifest = "examples/rollout/operator/webhook.yaml"

// newEnvironment is the control plane of the module at root: its validating webhook on the
// labelled ConfigMaps points at 127.0.0.1 and a free port, where the Service listens.
func newEnvironment(root string) *envtest.Environment {
	return &envtest.Environment{
		// Above envtest's 20s default: a busy machine takes longer to start kube-apiserver.
		ControlPlaneStartTimeout: time.Minute,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			LocalServingHost: "127.0.0.1",
			Paths:            []string{filepath.Join(root, webhookManifest)},
		},
	}
}

// creates creates burst labelled ConfigMaps every interval, each in a goroutine of its own,
// until stopped, and records each one's start, latency and error.
type creates struct {
	mu     sync.Mutex
	done   []create
	stop   chan struct{}
	wg     sync.WaitGroup
	ticker *time.Ticker
}

type create struct {
	start time.Time
	took  time.Duration
	err   error
}

func startCreating(ctx context.Context, c client.Client, ns, mode string, interval time.Duration, burst int) *creates {
	cr := &creates{stop: make(chan struct{}), ticker: time.NewTicker(interval)}
	cr.wg.Go(func() {
		for i := 0; ; i += burst {
			select {
			case <-cr.ticker.C:
			case <-cr.stop:
				return
			case <-ctx.Done():
				return
			}
			for j := range burst {
				cr.wg.Go(func() { cr.create(ctx, c, ns, mode, i+j) })
			}
		}
	})
	return cr
}

func (cr *creates) create(ctx context.Context, c client.Client, ns, mode string, i int) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("cm-%05d", i), Namespace: ns, Labels: map[string]string{labelKey: mode},
	}}
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err := c.Create(cctx, cm)
	cancel()
	cr.mu.Lock()
	cr.done = append(cr.done, create{start: start, took: time.Since(start), err: err})
	cr.mu.Unlock()
}

// finish stops creating and returns every create, once each returned.
func (cr *creates) finish() []create {
	cr.ticker.Stop()
	close(cr.stop)
	cr.wg.Wait()
	return cr.done
}

// waitAllReconciled waits until every labelled ConfigMap in ns has doneAnnotation, or
// timeout; it returns how many did not, and per replica how many it reconciled.
func waitAllReconciled(
	ctx context.Context, c client.Client, ns string, timeout time.Duration,
) (int, map[string]int, error) {
	var lost int
	by := map[string]int{}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var l corev1.ConfigMapList
		if err := c.List(ctx, &l, client.InNamespace(ns), client.HasLabels{labelKey}); err != nil {
			return false, err
		}
		lost, by = 0, map[string]int{}
		for _, cm := range l.Items {
			if id, ok := cm.Annotations[doneAnnotation]; ok {
				by[id]++
			} else {
				lost++
			}
		}
		return lost == 0, nil
	})
	if lost > 0 && wait.Interrupted(err) {
		err = nil // the count says it
	}
	return lost, by, err
}
