package runnable_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/runnable"
)

// anyLocalPort is a metrics server's address that NewManager accepts and nothing binds.
const anyLocalPort = "127.0.0.1:0"

// leaderOptions are manager Options with leader election on, as the scaffold's --leader-elect.
func leaderOptions() ctrl.Options {
	return ctrl.Options{
		LeaderElection: true, LeaderElectionID: "quiesce-test", LeaderElectionNamespace: "default",
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	}
}

// setupManager runs the setup the README shows: Setup, NewManager, Add.
func setupManager(t *testing.T, mo *ctrl.Options, opts runnable.Options) (ctrl.Manager, *runnable.Runnable) {
	t.Helper()
	// No listener on a fixed port (controller-runtime's metrics default is :8080): packages'
	// tests run at once.
	if mo.Metrics.BindAddress == "" {
		mo.Metrics.BindAddress = "0"
	}
	if mo.HealthProbeBindAddress == "" {
		mo.HealthProbeBindAddress = "0"
	}
	q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, mo, opts)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, *mo)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Add(mgr); err != nil {
		t.Fatal(err)
	}
	return mgr, q
}

// The config handed to Setup stays as it was: the lock gets a copy
// (leaderelection.NewResourceLock sets a 5s Timeout and a user agent on what it is given).
func TestSetupLeavesTheConfigAsItWas(t *testing.T) {
	cfg := &rest.Config{Host: noAPIServer, QPS: 7}
	want := rest.CopyConfig(cfg)
	mo := leaderOptions()
	if _, err := runnable.Setup(cfg, &mo, runnable.Options{}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("config after Setup = %+v, want it unchanged: %+v", cfg, want)
	}
	// The manager made from it next has no client timeout (was 5s: RenewDeadline/2).
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		t.Fatal(err)
	}
	if d := mgr.GetHTTPClient().Timeout; d != 0 {
		t.Fatalf("the manager's HTTP client times out after %v, want no timeout, as without quiesce", d)
	}
}

// Setup changes only the two seams it documents, the lease lock and the webhook server,
// with leader election on and off; NewClient and the metrics filter stay the caller's.
func TestSetupChangesOnlyItsDocumentedFields(t *testing.T) {
	for _, elect := range []bool{true, false} {
		mo := leaderOptions()
		mo.LeaderElection = elect
		mo.GracefulShutdownTimeout = ptr.To(40 * time.Second)
		mo.Metrics.FilterProvider = noFilter
		before := mo
		if _, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, runnable.Options{}); err != nil {
			t.Fatal(err)
		}
		if mo.LeaderElectionResourceLockInterface == nil || mo.WebhookServer == nil {
			t.Fatalf("Setup left lock %v, webhook server %v", mo.LeaderElectionResourceLockInterface, mo.WebhookServer)
		}
		after := mo
		after.LeaderElectionResourceLockInterface, after.WebhookServer = before.LeaderElectionResourceLockInterface, before.WebhookServer
		if fmt.Sprintf("%p", after.Metrics.FilterProvider) != fmt.Sprintf("%p", before.Metrics.FilterProvider) {
			t.Fatal("Setup changed Metrics.FilterProvider")
		}
		after.Metrics.FilterProvider, before.Metrics.FilterProvider = nil, nil
		if !reflect.DeepEqual(after, before) {
			t.Fatalf("Setup changed undocumented fields:\n%+v\nwant\n%+v", after, before)
		}
	}
}

// A Setup that fails leaves the Options as they were; a corrected one works.
func TestFailedSetupLeavesTheOptionsAsTheyWere(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts runnable.Options
		mo   func() ctrl.Options
		want string
	}{
		{"grace at the default budget", runnable.Options{GracePeriod: 30 * time.Second}, leaderOptions,
			"raise the manager's GracefulShutdownTimeout above 30s"},
		{"negative delay", runnable.Options{ShutdownDelay: -time.Second}, leaderOptions, "ShutdownDelay is -1s"},
		{"reports every 1ns", runnable.Options{ReportEvery: time.Nanosecond}, leaderOptions, "ReportEvery is 1ns: set it to 0 (the default) or at least 500ms"},
		{"debug on the pod's network", runnable.Options{DebugAddress: ":8083"}, leaderOptions, "set a loopback host:port"},
		{"no lease namespace", runnable.Options{}, func() ctrl.Options {
			mo := leaderOptions()
			mo.LeaderElectionNamespace = ""
			return mo
		}, "set LeaderElectionNamespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo := tc.mo()
			_, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "failed to set up quiesce: ") {
				t.Fatalf("Setup = %v, want an error with %q", err, tc.want)
			}
			if mo.LeaderElectionResourceLockInterface != nil || mo.WebhookServer != nil {
				t.Fatal("a failed Setup changed the manager's Options")
			}
		})
	}
	if _, err := runnable.Setup(&rest.Config{}, nil, runnable.Options{}); err == nil || !strings.Contains(err.Error(), "nil manager Options") {
		t.Fatalf("Setup(nil Options) = %v", err)
	}
}

// The order mistakes that the Options given to Setup show at Add are errors naming the fix.
func TestRunnableAddRefusesOrderMistakes(t *testing.T) {
	cfg := &rest.Config{Host: noAPIServer}
	for _, tc := range []struct {
		name  string
		after func(*ctrl.Options) // between Setup and NewManager
		want  string
	}{
		{"webhook server set after Setup", func(o *ctrl.Options) { o.WebhookServer = webhook.NewServer(webhook.Options{Port: 9443}) },
			"changed after runnable.Setup: call Setup once mgrOpts is complete"},
		{"leader election turned off after Setup", func(o *ctrl.Options) { o.LeaderElection = false },
			"changed after runnable.Setup"},
		{"lock set after Setup", func(o *ctrl.Options) { o.LeaderElectionResourceLockInterface = nil }, "changed after runnable.Setup"},
		{"timeout lowered after Setup", func(o *ctrl.Options) { o.GracefulShutdownTimeout = ptr.To(10 * time.Second) },
			"must be below the manager's GracefulShutdownTimeout (10s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo := leaderOptions()
			q, err := runnable.Setup(cfg, &mo, runnable.Options{})
			if err != nil {
				t.Fatal(err)
			}
			tc.after(&mo)
			mgr, err := ctrl.NewManager(cfg, mo)
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Add(mgr); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Add = %v, want an error with %q", err, tc.want)
			}
		})
	}
	if err := runnable.NewUnmanaged(runnable.Options{}).Add(newManager(t, &ctrl.Options{})); err == nil ||
		!strings.Contains(err.Error(), "it was not made by runnable.Setup") {
		t.Fatalf("Add of a Runnable of New = %v", err)
	}
	mo := leaderOptions()
	if _, err := runnable.Setup(cfg, &mo, runnable.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := runnable.Setup(cfg, &mo, runnable.Options{}); err == nil || !strings.Contains(err.Error(), "given to runnable.Setup already") {
		t.Fatalf("Setup twice = %v", err)
	}
	mo = leaderOptions()
	mgr, q := setupManager(t, &mo, runnable.Options{})
	if err := q.Add(mgr); err == nil || !strings.Contains(err.Error(), "call q.Add(mgr) once") {
		t.Fatalf("Add twice = %v", err)
	}
}

// Leader election turned on in a copy of the Options after Setup saw it off (issue 42: Add
// returned nil, nothing was fenced, nothing logged): the manager never leads, and
// mgr.Start returns the Runnable's error naming the fix. Fails on v0.2.0's Setup: mgr.Start
// runs until its context ends, then returns nil.
func TestLeaderElectionTurnedOnAfterSetupFailsTheManager(t *testing.T) {
	mo := leaderOptions()
	mo.LeaderElection = false
	q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, runnable.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cp := mo
	cp.LeaderElection = true
	mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, cp)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Add(mgr); err != nil { // q.Add sees mo, unchanged: the copy shows at Start
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = mgr.Start(q.StopContext(ctx))
	if err == nil || !strings.Contains(err.Error(), "leader election was turned on after runnable.Setup saw it off") ||
		!strings.Contains(err.Error(), "call runnable.Setup(cfg, &mgrOpts, opts) once mgrOpts.LeaderElection is set") {
		t.Fatalf("mgr.Start = %v, want the error naming the fix", err)
	}
	select {
	case <-mgr.Elected():
		t.Fatal("the manager led through the lock of Setup")
	default:
	}
}

// controller-runtime's idiom, mgr.Add(q) instead of q.Add(mgr), fails mgr.Start naming the
// fix, with leader election on and off, and the executor drains. Fails on v0.3.0: mgr.Start
// ran until its context ended and returned nil, with no readyz check, metrics or lease check.
func TestMgrAddInsteadOfAddFailsTheManager(t *testing.T) {
	for name, mo := range map[string]ctrl.Options{"leaderElection": leaderOptions(),
		"noLeaderElection": {Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"}} {
		t.Run(name, func(t *testing.T) {
			q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, runnable.Options{Logger: logr.Discard()})
			if err != nil {
				t.Fatal(err)
			}
			mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, mo)
			if err != nil {
				t.Fatal(err)
			}
			if err := mgr.Add(q); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := mgr.Start(ctx); err == nil || !strings.Contains(err.Error(), "call q.Add(mgr) instead of mgr.Add(q)") {
				t.Fatalf("mgr.Start = %v, want the error naming q.Add(mgr)", err)
			}
			if ctx.Err() != nil {
				t.Fatal("mgr.Start returned only when its context ended")
			}
			select {
			case <-q.Executor().Draining():
			default:
				t.Error("the executor of a Runnable refused at Start does not drain")
			}
		})
	}
}

// The setup of the README: the manager's webhook server is the wrapped one (also when the
// Options had none: controller-runtime's default, wrapped), the lock is observed, and the
// executor is the Runnable's.
func TestSetupConnectsTheManager(t *testing.T) {
	for name, ws := range map[string]webhook.Server{"default": nil, "own": webhook.NewServer(webhook.Options{Port: 9555})} {
		t.Run(name, func(t *testing.T) {
			mo := leaderOptions()
			mo.WebhookServer = ws
			mgr, q := setupManager(t, &mo, runnable.Options{})
			if got := mgr.GetWebhookServer(); got != mo.WebhookServer || reflect.TypeOf(got).String() != "*runnable.webhookServer" {
				t.Fatalf("the manager's webhook server is %T, want the one Setup wrapped", got)
			}
			if q.Executor() == nil {
				t.Fatal("no executor")
			}
		})
	}
}

// DebugPath is served on the metrics server only behind a FilterProvider of the Options given
// to Setup, as they are at Add, never on a server that authenticates no one,
// and the reason it is not served is said at V(1) only.
func TestSetupServesDebugFromTheRealMetricsServer(t *testing.T) {
	filter := func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
		return func(_ logr.Logger, h http.Handler) (http.Handler, error) { return h, nil }, nil
	}
	for _, tc := range []struct {
		name   string
		mo     func(*ctrl.Options)
		after  func(*ctrl.Options) // between Setup and NewManager
		opts   runnable.Options
		served bool
		v1     string // the V(1) line when not served
	}{
		{"behind the filter", func(o *ctrl.Options) { o.Metrics.FilterProvider = filter }, nil, runnable.Options{}, true, ""},
		{"no filter", nil, nil, runnable.Options{}, false, "the metrics server authenticates no one"},
		{"filter dropped after Setup", func(o *ctrl.Options) { o.Metrics.FilterProvider = filter },
			func(o *ctrl.Options) { o.Metrics.FilterProvider = nil }, runnable.Options{}, false,
			"the metrics server authenticates no one"},
		{"metrics off", func(o *ctrl.Options) { o.Metrics.BindAddress = "0" }, nil, runnable.Options{}, false,
			"the manager's metrics server is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs []string
			mo := ctrl.Options{Metrics: metricsserver.Options{BindAddress: anyLocalPort}, HealthProbeBindAddress: "0"}
			if tc.mo != nil {
				tc.mo(&mo)
			}
			tc.opts.Logger = funcr.New(func(_, args string) { logs = append(logs, args) },
				funcr.Options{Verbosity: 1, LogInfoLevel: ptr.To("v")})
			q, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.after != nil {
				tc.after(&mo)
			}
			mgr, err := ctrl.NewManager(&rest.Config{Host: noAPIServer}, mo)
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Add(mgr); err != nil {
				t.Fatal(err)
			}
			// A second handler at the path is refused exactly when quiesce serves it.
			served := mgr.AddMetricsServerExtraHandler(runnable.DebugPath, http.NotFoundHandler()) != nil
			if served != tc.served {
				t.Fatalf("DebugPath served = %v, want %v", served, tc.served)
			}
			switch {
			case tc.v1 == "" && len(logs) != 0:
				t.Fatalf("log = %q, want nothing", logs)
			case tc.v1 != "" && (len(logs) != 1 || !strings.Contains(logs[0], tc.v1) || !strings.HasPrefix(logs[0], `"v"=1 `)):
				t.Fatalf("log = %q, want one V(1) line with %q", logs, tc.v1)
			}
		})
	}
}

// Options.DebugAddress serves DebugPath on a loopback listener of its own, for operators
// whose metrics server has no filter (issue 45), from Add until the manager stops.
func TestDebugAddressServesOnLoopback(t *testing.T) {
	var logs capture
	mo := ctrl.Options{}
	mgr, q := setupManager(t, &mo, runnable.Options{DebugAddress: "127.0.0.1:0", Logger: logs.logger()})
	var addr string
	for _, l := range logs.all() {
		if _, after, ok := strings.Cut(l, `"msg"="Serving the debug view on loopback" "address"="`); ok {
			addr, _, _ = strings.Cut(after, `"`)
		}
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("log %q, want the address served", logs.all())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(q.StopContext(ctx)) }()
	// The listener is bound from Add on: the request waits until the manager serves it.
	client := &http.Client{Timeout: time.Minute}
	res, err := client.Get("http://" + addr + runnable.DebugPath + "?limit=0")
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Count *int }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil || res.StatusCode != http.StatusOK || body.Count == nil {
		t.Fatalf("GET %s: %d, %+v, %v; want the debug view", addr, res.StatusCode, body, err)
	}
	_ = res.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()
	if _, err := client.Get("http://" + addr + runnable.DebugPath); err == nil {
		t.Fatal("the debug listener still serves after the manager stopped")
	}
}

// The budget where the process runs: ShutdownDelay plus the manager's GracefulShutdownTimeout
// below TerminationGracePeriod, refused by Setup naming the fields (their flags when bound).
// Fails on v0.3.0, which had no TerminationGracePeriod: a kubelet's SIGKILL cut the stop.
func TestSetupRefusesAStopLongerThanTheTerminationGracePeriod(t *testing.T) {
	timeout := 40 * time.Second
	for _, tc := range []struct {
		name    string
		opts    runnable.Options
		flags   []string
		timeout *time.Duration
		want    string // "": no error
	}{
		{name: "default timeout", opts: runnable.Options{TerminationGracePeriod: 30 * time.Second},
			want: "ShutdownDelay (0s) plus the manager's GracefulShutdownTimeout (30s, controller-runtime's default, as the manager's Options set none) must be below TerminationGracePeriod (30s)"},
		{name: "fits", opts: runnable.Options{TerminationGracePeriod: 31 * time.Second}},
		{name: "delay", opts: runnable.Options{ShutdownDelay: 10 * time.Second, TerminationGracePeriod: 45 * time.Second},
			timeout: &timeout, want: "above 50s"},
		{name: "flags", flags: []string{"--quiesce-shutdown-delay=5s", "--quiesce-termination-grace-period=30s"},
			want: "--quiesce-shutdown-delay (ShutdownDelay) (5s) plus the manager's GracefulShutdownTimeout (30s"},
		{name: "not checked", opts: runnable.Options{ShutdownDelay: time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if tc.flags != nil {
				fs := flag.NewFlagSet("operator", flag.ContinueOnError)
				opts.BindFlags(fs)
				if err := fs.Parse(tc.flags); err != nil {
					t.Fatal(err)
				}
			}
			mo := ctrl.Options{GracefulShutdownTimeout: tc.timeout}
			_, err := runnable.Setup(&rest.Config{Host: noAPIServer}, &mo, opts)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Setup = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Setup = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
