package shutdowntest

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/runnable"
)

// Defaults of Options. DefaultStopTimeout bounds the stop of the operator's process
// (Options.StopTimeout), not a daemon's (reconcilers.DefaultDaemonStopTimeout).
const (
	DefaultReadyTimeout = 60 * time.Second
	DefaultStopTimeout  = 90 * time.Second
	DefaultWaitTimeout  = 2 * time.Minute
)

// How long the harness waits for things that take no time (the log's end after the exit, the
// exit after a second SIGTERM at most, one HTTP request), how often it polls /readyz, and how
// much of the log an error shows.
const (
	logDrainTimeout    = 5 * time.Second
	secondSignalWait   = 5 * time.Second
	requestTimeout     = 5 * time.Second
	readyPollInterval  = 100 * time.Millisecond
	headLinesInErrors  = 5
	lastLinesInErrors  = 20
	maxLineBytes       = 1 << 20
	operatorUserName   = "shutdowntest"
	kubeconfigFileName = "kubeconfig"
)

// Options say which operator to run and how. Zero values mean the defaults documented on
// each field; Package (or Binary) is required, and exactly one of Env, Config and Kubeconfig,
// the cluster the operator runs against.
type Options struct {
	// Package is the operator's main package as `go build` takes it, e.g. "./cmd". Required.
	Package string
	// Dir is where `go build` runs, and the operator's working directory: usually the
	// module's root. "": the current directory (in `go test`, the test's package directory).
	Dir string
	// BuildFlags are extra `go build` flags. Part of Build's cache key. When the test itself
	// runs with the race detector (`go test -race`) and BuildFlags do not mention -race, Build
	// adds -race: the operator runs under the detector too, and its build reuses the packages
	// `go test -race` compiled. "-race=false" builds without it.
	BuildFlags []string
	// Binary, if set, is the operator's binary: Start runs it and builds nothing.
	Binary string

	// Env is the suite's started envtest environment. Start adds a user of the group
	// system:masters to it (Environment.AddUser; concurrent Starts take turns) and gives the
	// operator that user's kubeconfig, in the KUBECONFIG environment variable. When Env
	// installs webhooks, Flags gets where their configurations send requests
	// (Endpoints.Webhook).
	Env *envtest.Environment
	// Config is a cluster given as a client configuration (kind's, a real cluster's, or a
	// suite's own control plane): Start writes it as the operator's kubeconfig, credentials
	// included, into a file of its own (mode 0600, removed once the operator exited). What a
	// kubeconfig cannot hold (Proxy, Dial, WrapTransport) is left out.
	Config *rest.Config
	// Kubeconfig is a cluster given as a kubeconfig file, e.g. kind's: the operator gets its
	// path (made absolute) in KUBECONFIG; its current context is the one used.
	Kubeconfig string

	// Flags returns the flags that bind the operator's metrics and probe servers to the
	// addresses the harness chose; Start calls it once, just before the process starts.
	// nil: KubebuilderFlags.
	Flags func(Endpoints) []string
	// Args are further flags, after those of Flags, e.g. "--quiesce-grace-period=5s".
	Args []string

	// MetricsSecure says the operator's metrics server, and /debug/quiesce on it, serve HTTPS
	// with authentication and authorization (kubebuilder's default: SecureServing with
	// controller-runtime's filters.WithAuthenticationAndAuthorization). Start then makes a
	// serving certificate for it, signed by a CA of the harness's own
	// (Endpoints.MetricsCertDir; KubebuilderFlags passes it as kubebuilder's
	// --metrics-cert-path and leaves --metrics-secure at its default), and PendingCount and
	// PendingCalls send a token (MetricsToken) over HTTPS to a server that proves it holds
	// that certificate, and to no other. false: the metrics server serves plain HTTP
	// (KubebuilderFlags passes --metrics-secure=false), and quiesce, which serves
	// /debug/quiesce on no server that authenticates no one, serves it on a loopback
	// listener of its own (Endpoints.Debug; KubebuilderFlags passes --quiesce-debug-address),
	// where PendingCount and PendingCalls read it.
	MetricsSecure bool
	// MetricsInsecureSkipVerify makes PendingCount and PendingCalls read a secure metrics
	// server without verifying its certificate: for an operator whose main cannot be given
	// one (controller-runtime then serves a self-signed certificate of its own). They send
	// it MetricsToken, or the harness's own ServiceAccount's token, as ever: never the
	// cluster credentials.
	MetricsInsecureSkipVerify bool
	// MetricsToken is the bearer token sent to a secure metrics server. "": a token of a
	// ServiceAccount of the harness's own, never the cluster credentials' (the metrics
	// server is the operator's, not the API server). The first request that needs it
	// creates, with the cluster credentials, a namespace "shutdowntest-<random>", the
	// ServiceAccount "shutdowntest" in it, a ClusterRole "shutdowntest-metrics-reader-<random>"
	// (GET on /metrics and /debug/quiesce) and a ClusterRoleBinding of that name binding it
	// to the ServiceAccount, all labelled CreatedByLabel=CreatedBy, and asks a token of the
	// ServiceAccount (TokenRequest, valid 10 minutes). Once the operator exited, the harness
	// deletes them (each only if it is still the object it created): Stop returns an error
	// naming any it could not delete, with the kubectl command that does; after Kill, or the
	// end of Start's context, that error goes to Output.
	MetricsToken string

	// LeaderElection runs the operator with leader election on (see WaitLeader):
	// KubebuilderFlags passes --leader-elect, and the operator's environment has
	// POD_NAMESPACE set to LeaderElectionNamespace. Outside a cluster controller-runtime
	// needs the lease's namespace (Options.LeaderElectionNamespace; in a pod it reads its
	// own): kubebuilder's scaffold gives none, so the operator's main passes
	// os.Getenv("POD_NAMESPACE") (empty in a pod without that variable: the pod's own), or
	// Flags passes the namespace to a flag of its own.
	LeaderElection bool
	// LeaderElectionNamespace is the namespace of the lease; it must exist. "": "default".
	LeaderElectionNamespace string

	// FreeWebhookPort gives the operator's webhook server a free port of its own on Env's
	// webhook host (Endpoints.Webhook), with Env's serving certificate, instead of the one
	// port that Env's webhook configurations send requests to: so that several operators
	// with webhooks can run at once (a second one on Env's port fails with "bind: address
	// already in use"). The API server's requests then reach none of them unless the spec
	// forwards Env's port to one, as a Service does (Service).
	FreeWebhookPort bool
	// Service puts the operator behind a Service of several replicas (NewService): its
	// webhook server gets a free port of its own on the Service's host and the Service's
	// serving certificate (Endpoints.Webhook and WebhookCertDir, whatever Env installs), and
	// once Start returns, the Service forwards new admission connections to it while it is
	// ready (see Service). nil: none.
	Service *Service

	// LogPrefix is written before each line copied to Output, e.g. "replica-1 | ", so that
	// the logs of several operators can be told apart. Lines and Result.Lines have none.
	LogPrefix string

	// ReadyTimeout bounds Start's wait for /readyz to answer 200, from the process's start
	// (the build before it is bounded by Start's context only). 0: DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// StopTimeout bounds Stop's wait for the exit after SIGTERM, before it sends a second
	// SIGTERM, then SIGKILL. 0: DefaultStopTimeout. Set it above the operator's own
	// GracefulShutdownTimeout.
	StopTimeout time.Duration
	// WaitTimeout bounds each wait of WaitLines (and of the waits built on it) when its
	// context has no earlier deadline. 0: DefaultWaitTimeout.
	WaitTimeout time.Duration

	// Output receives a copy of each line the operator writes (stdout and stderr), e.g.
	// GinkgoWriter or a testing.T's writer. nil: none; Result.Lines keeps them all anyway.
	Output io.Writer

	// PassEnv names further variables of the test's environment that the operator gets,
	// e.g. []string{"MY_OPERATOR_REGION"}. The operator does not inherit the test's whole
	// environment (in CI it holds secrets): it gets KUBECONFIG, the variables in
	// DefaultPassEnv that are set, and those named here that are set.
	PassEnv []string
}

// DefaultPassEnv are the variables of the test's environment that every operator Start
// runs gets, when set: what a Go program and its runtime read (GOCOVERDIR, for coverage of
// the operator), and the basics of a process's environment.
var DefaultPassEnv = []string{
	"PATH", "HOME", "USER", "TMPDIR", "LANG", "LC_ALL", "TZ",
	"GODEBUG", "GOMAXPROCS", "GOMEMLIMIT", "GOGC", "GORACE", "GOTRACEBACK", "GOCOVERDIR",
}

func (o *Options) setDefaults() error {
	if o.Package == "" && o.Binary == "" {
		return errors.New("invalid options: Package (or Binary) is required")
	}
	clusters := 0
	for _, set := range []bool{o.Env != nil, o.Config != nil, o.Kubeconfig != ""} {
		if set {
			clusters++
		}
	}
	if clusters != 1 {
		return fmt.Errorf("invalid options: set exactly one of Env, Config and Kubeconfig (the cluster the "+
			"operator runs against), not %d", clusters)
	}
	if o.Flags == nil {
		o.Flags = KubebuilderFlags
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	if o.WaitTimeout <= 0 {
		o.WaitTimeout = DefaultWaitTimeout
	}
	if internal.IsNil(o.Output) {
		o.Output = io.Discard
	}
	if o.LeaderElection && o.LeaderElectionNamespace == "" {
		o.LeaderElectionNamespace = "default"
	}
	return nil
}

// Endpoints are the addresses of the operator's servers.
type Endpoints struct {
	Metrics string // the metrics server, "127.0.0.1:port": /metrics, and /debug/quiesce with MetricsSecure
	Probe   string // the health probe server, "127.0.0.1:port": /healthz and /readyz
	// Debug is quiesce's debug listener (runnable.Options.DebugAddress), "127.0.0.1:port":
	// /debug/quiesce when the metrics server is not secure; "" with MetricsSecure.
	Debug string

	// MetricsSecure is Options.MetricsSecure: the metrics server serves HTTPS with
	// authentication.
	MetricsSecure bool
	// LeaderElectionNamespace is the lease's namespace when Options.LeaderElection is set,
	// "" otherwise.
	LeaderElectionNamespace string

	// Webhook is where the webhook configurations that Env installed send admission requests,
	// "host:port" (Env.WebhookInstallOptions.LocalServingHost and LocalServingPort); "" when
	// Env installs none. The operator's webhook server must listen there: KubebuilderFlags
	// passes its port as --webhook-port; for a main with other flags, pass it in
	// Options.Flags, or set LocalServingPort to the port it listens on before Env starts.
	// With Options.FreeWebhookPort: a free port of the operator's own on that host; with
	// Options.Service, on the Service's host.
	Webhook string
	// WebhookCertDir holds the serving certificate (tls.crt, tls.key) that Env's webhook
	// configurations trust; "" when Env installs no webhook.
	WebhookCertDir string
	// MetricsCertDir holds the serving certificate (tls.crt, tls.key, for 127.0.0.1) the
	// metrics server must serve when MetricsSecure is set (see Options.MetricsSecure); ""
	// otherwise.
	MetricsCertDir string
}

// KubebuilderFlags are the flags of a kubebuilder (go/v4) scaffold's main.go for e:
// --metrics-bind-address, --metrics-secure=false unless Options.MetricsSecure (the scaffold
// serves metrics over HTTPS with authentication by default) with
// --quiesce-debug-address=Endpoints.Debug, so that quiesce serves /debug/quiesce on a
// loopback listener of its own (bound by runnable.Options.BindFlags, as the adoption diff
// does; a main that binds no quiesce flags needs Options.Flags), --health-probe-bind-address,
// --leader-elect with Options.LeaderElection, and, when Env installs webhooks,
// --webhook-cert-path and --webhook-port (the scaffold's flags for its webhook server).
func KubebuilderFlags(e Endpoints) []string {
	flags := []string{"--metrics-bind-address=" + e.Metrics}
	if !e.MetricsSecure {
		flags = append(flags, "--metrics-secure=false")
	}
	if e.Debug != "" {
		flags = append(flags, "--quiesce-debug-address="+e.Debug)
	}
	if e.MetricsCertDir != "" {
		flags = append(flags, "--metrics-cert-path="+e.MetricsCertDir)
	}
	flags = append(flags, "--health-probe-bind-address="+e.Probe)
	if e.LeaderElectionNamespace != "" {
		flags = append(flags, "--leader-elect")
	}
	if e.Webhook != "" {
		_, port, _ := net.SplitHostPort(e.Webhook)
		flags = append(flags, "--webhook-cert-path="+e.WebhookCertDir, "--webhook-port="+port)
	}
	return flags
}

// webhookEndpoints fills in e's webhook fields from env.
func webhookEndpoints(env *envtest.Environment, e *Endpoints) {
	w := &env.WebhookInstallOptions
	if len(w.MutatingWebhooks)+len(w.ValidatingWebhooks) == 0 {
		return
	}
	e.Webhook = net.JoinHostPort(w.LocalServingHost, strconv.Itoa(w.LocalServingPort))
	e.WebhookCertDir = w.LocalServingCertDir
}

// builds caches Build's binaries for the life of the process.
var builds = struct {
	sync.Mutex
	dir     string // holds every binary; removed by Cleanup
	entries map[string]*build
}{entries: map[string]*build{}}

type build struct {
	index  int        // the binary's subdirectory
	mu     sync.Mutex // held while building
	binary string     // set once built
}

// Build builds opts.Package in opts.Dir with opts.BuildFlags (with -race added when the test
// runs with the race detector; see Options.BuildFlags) and returns the binary's path.
// It builds once per (Dir, Package, BuildFlags) per process: later calls return the same
// binary, concurrent ones wait for the first (a failed build is tried again). The binaries
// live in one temporary directory for the life of the process: Cleanup removes it (call it
// at the end of the suite, e.g. in TestMain or AfterSuite); otherwise it stays in os.TempDir.
// A build that fails returns go build's output in the error.
func Build(ctx context.Context, opts Options) (string, error) {
	if opts.Package == "" {
		return "", errors.New("invalid options: Package is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return "", fmt.Errorf("failed to resolve directory %q: %w", opts.Dir, err)
	}
	flags := buildFlags(opts.BuildFlags)
	key := strings.Join(append([]string{dir, opts.Package}, flags...), "\x00")

	builds.Lock()
	if builds.dir == "" {
		if builds.dir, err = os.MkdirTemp("", "quiesce-shutdowntest-"); err != nil {
			builds.Unlock()
			return "", fmt.Errorf("failed to create a directory for the binaries: %w", err)
		}
	}
	b := builds.entries[key]
	if b == nil {
		b = &build{index: len(builds.entries)}
		builds.entries[key] = b
	}
	binDir := builds.dir
	builds.Unlock()

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.binary != "" {
		return b.binary, nil
	}
	sub := filepath.Join(binDir, strconv.Itoa(b.index))
	if err := os.MkdirAll(sub, 0o755); err != nil {
		return "", fmt.Errorf("failed to create a directory for the binary: %w", err)
	}
	bin := filepath.Join(sub, binaryName(dir, opts.Package))
	args := append(append([]string{"build", "-o", bin}, flags...), opts.Package)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("failed to build %s: %w", opts.Package, ctx.Err())
		}
		return "", fmt.Errorf("failed to build %s (go %s in %s): %w\n%s",
			opts.Package, strings.Join(args, " "), dir, err, strings.TrimSpace(string(out)))
	}
	b.binary = bin
	return bin, nil
}

// binaryName returns the name of the binary of pkg, built in dir: the package's own directory
// name ("demo-operator", "cmd"; for ".", dir's name), as ps shows it. `go build -o` then
// writes a file of that name, never into a directory.
func binaryName(dir, pkg string) string {
	name := path.Base(filepath.ToSlash(pkg))
	if name == "." || name == ".." || name == "/" {
		name = filepath.Base(filepath.Join(dir, pkg))
	}
	if name == "." || name == string(filepath.Separator) || strings.Contains(name, "...") {
		return "operator"
	}
	return name
}

// buildFlags returns flags with -race first when this process runs with the race detector and
// flags do not mention -race.
func buildFlags(flags []string) []string {
	for _, f := range flags {
		if name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "="); name == "race" {
			return flags
		}
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				return append([]string{"-race"}, flags...)
			}
		}
	}
	return flags
}

// Cleanup removes the binaries Build made; a later Build builds again.
func Cleanup() error {
	builds.Lock()
	defer builds.Unlock()
	dir := builds.dir
	builds.dir, builds.entries = "", map[string]*build{}
	if dir == "" {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("failed to remove the binaries: %w", err)
	}
	return nil
}

// Operator is a running operator process started by Start.
type Operator struct {
	opts      Options
	endpoints Endpoints
	cmd       *exec.Cmd
	tmp       string        // the kubeconfig's directory, removed once the process is gone
	exited    chan struct{} // closed once the process was reaped
	logDone   chan struct{} // closed once the log goroutine returned
	stopCtx   func() bool   // stops watching Start's ctx
	http      *http.Client  // for the metrics and probe servers

	tokenMu    sync.Mutex      // held while the metrics token is made, and while what was made is deleted
	token      string          // the bearer token for a secure metrics server, once made
	created    *clusterObjects // what the harness created in the cluster for token
	cleanedUp  bool            // created was deleted: make nothing more
	cleanupErr error           // cleanUp's, set before exited is closed

	mu       sync.Mutex
	lines    []string
	changed  chan struct{} // closed, and replaced, when a line is added (WaitLines)
	signalAt time.Time     // the first SIGTERM of Stop
	signaled int           // len(lines) at signalAt
	killed   bool          // Stop had to send a second SIGTERM or SIGKILL
	reaped   bool          // the process group was killed and the pid may be reaped: kill no more
	exitedAt time.Time
}

// addUser serializes Environment.AddUser: it signs certificates with the environment's CA,
// which is not safe for concurrent use.
var addUser sync.Mutex

// Start builds the operator (Build) unless opts.Binary is set, runs it with opts.Flags and
// opts.Args against opts's cluster (Env, Config or Kubeconfig), and returns once GET /readyz
// on its probe address answers 200. It fails, killing the process, when the operator exits
// before it is ready (the error has the exit status and the log's first and last lines), or
// is not ready within ReadyTimeout (with the log's lines likewise), or when ctx ends. When
// ctx ends later, the operator is killed: pass a context that lasts as long as the spec.
// Call Stop, or Kill (e.g. with DeferCleanup), once done. Start may be called concurrently.
func Start(ctx context.Context, opts Options) (*Operator, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	bin := opts.Binary
	if bin == "" {
		var err error
		if bin, err = Build(ctx, opts); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp("", "quiesce-shutdowntest-run-")
	if err != nil {
		return nil, fmt.Errorf("failed to create a temporary directory: %w", err)
	}
	op, err := start(ctx, bin, tmp, opts)
	if err != nil {
		_ = os.RemoveAll(tmp) // nothing else to do about it; the error says what failed first
		return nil, err
	}
	if err := op.waitReady(ctx); err != nil {
		op.Kill()
		return nil, err
	}
	if opts.Service != nil {
		opts.Service.add(op)
	}
	return op, nil
}

// kubeconfig returns the path of the operator's kubeconfig for opts's cluster, written into
// tmp unless opts.Kubeconfig gives one.
func kubeconfig(tmp string, opts Options) (string, error) {
	if opts.Kubeconfig != "" {
		// Absolute: the operator runs in opts.Dir.
		file, err := filepath.Abs(opts.Kubeconfig)
		if err != nil {
			return "", fmt.Errorf("failed to resolve the kubeconfig %q: %w", opts.Kubeconfig, err)
		}
		return file, nil
	}
	var data []byte
	var err error
	if opts.Env != nil {
		addUser.Lock()
		user, uerr := opts.Env.AddUser(envtest.User{Name: operatorUserName, Groups: []string{"system:masters"}}, nil)
		addUser.Unlock()
		if uerr != nil {
			return "", fmt.Errorf("failed to add the operator's user: %w", uerr)
		}
		data, err = user.KubeConfig()
	} else {
		data, err = kubeconfigFromREST(opts.Config)
	}
	if err != nil {
		return "", fmt.Errorf("failed to make the operator's kubeconfig: %w", err)
	}
	file := filepath.Join(tmp, kubeconfigFileName)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return "", fmt.Errorf("failed to write the operator's kubeconfig: %w", err)
	}
	return file, nil
}

// kubeconfigFromREST returns cfg as a kubeconfig with one context, the current one.
func kubeconfigFromREST(cfg *rest.Config) ([]byte, error) {
	const name = "shutdowntest"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   strings.TrimSuffix(cfg.Host, "/") + cfg.APIPath,
		TLSServerName:            cfg.ServerName,
		InsecureSkipTLSVerify:    cfg.Insecure,
		CertificateAuthority:     cfg.CAFile,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificate:     cfg.CertFile,
		ClientCertificateData: cfg.CertData,
		ClientKey:             cfg.KeyFile,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
		TokenFile:             cfg.BearerTokenFile,
		Impersonate:           cfg.Impersonate.UserName,
		ImpersonateUID:        cfg.Impersonate.UID,
		ImpersonateGroups:     cfg.Impersonate.Groups,
		ImpersonateUserExtra:  cfg.Impersonate.Extra,
		Username:              cfg.Username,
		Password:              cfg.Password,
		AuthProvider:          cfg.AuthProvider,
		Exec:                  cfg.ExecProvider,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.Write(*kc)
}

func start(ctx context.Context, bin, tmp string, opts Options) (*Operator, error) {
	kubeconfigPath, err := kubeconfig(tmp, opts)
	if err != nil {
		return nil, err
	}
	e, err := endpoints(opts)
	if err != nil {
		return nil, err
	}
	var roots *x509.CertPool
	if opts.MetricsSecure {
		e.MetricsCertDir = filepath.Join(tmp, metricsCertDirName)
		if roots, err = metricsCert(e.MetricsCertDir); err != nil {
			return nil, err
		}
	}

	cmd := exec.Command(bin, append(opts.Flags(e), opts.Args...)...)
	cmd.Dir = opts.Dir
	cmd.Env = operatorEnv(kubeconfigPath, opts.PassEnv)
	if opts.LeaderElection {
		cmd.Env = append(cmd.Env, "POD_NAMESPACE="+opts.LeaderElectionNamespace)
	}
	cmd.SysProcAttr = sysProcAttr()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("failed to create a pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = w, w // one stream, in the order written
	err = cmd.Start()
	_ = w.Close() // the operator has its own copy of the write end
	if err != nil {
		_ = r.Close()
		return nil, startError(bin, err)
	}
	op := &Operator{
		opts:      opts,
		endpoints: e,
		cmd:       cmd,
		tmp:       tmp,
		exited:    make(chan struct{}),
		logDone:   make(chan struct{}),
		changed:   make(chan struct{}),
		http:      httpClient(roots, opts.MetricsInsecureSkipVerify),
	}
	// The operator never outlives ctx.
	op.stopCtx = context.AfterFunc(ctx, op.kill)
	go op.readLog(r)
	go op.reap()
	return op, nil
}

// operatorEnv returns the operator's environment: KUBECONFIG, then the variables of
// DefaultPassEnv and pass that are set in this process's.
func operatorEnv(kubeconfig string, pass []string) []string {
	env := []string{"KUBECONFIG=" + kubeconfig}
	for _, name := range append(slices.Clone(DefaultPassEnv), pass...) {
		if v, ok := os.LookupEnv(name); ok && name != "KUBECONFIG" {
			env = append(env, name+"="+v)
		}
	}
	return env
}

// endpoints chooses the operator's addresses.
func endpoints(opts Options) (Endpoints, error) {
	var err error
	e := Endpoints{MetricsSecure: opts.MetricsSecure, LeaderElectionNamespace: opts.LeaderElectionNamespace}
	if e.Metrics, err = freeAddr("127.0.0.1"); err != nil {
		return Endpoints{}, err
	}
	if e.Probe, err = freeAddr("127.0.0.1"); err != nil {
		return Endpoints{}, err
	}
	if !opts.MetricsSecure {
		if e.Debug, err = freeAddr("127.0.0.1"); err != nil {
			return Endpoints{}, err
		}
	}
	if opts.Env != nil {
		webhookEndpoints(opts.Env, &e)
	}
	if opts.FreeWebhookPort && e.Webhook != "" {
		host, _, _ := net.SplitHostPort(e.Webhook)
		if e.Webhook, err = freeAddr(host); err != nil {
			return Endpoints{}, err
		}
	}
	if opts.Service != nil {
		if e.Webhook, err = freeAddr(opts.Service.host); err != nil {
			return Endpoints{}, err
		}
		e.WebhookCertDir = opts.Service.certDir
	}
	return e, nil
}

// startError explains why bin could not be started.
func startError(bin string, err error) error {
	if fi, serr := os.Stat(bin); serr == nil && fi.IsDir() {
		return fmt.Errorf("failed to start %s: it is a directory, not the operator's binary: "+
			"set Options.Binary to the binary's file, or leave it empty and set Options.Package: %w", bin, err)
	}
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("failed to start %s: it is not executable: check Options.Binary "+
			"(a file built by go build, mode +x): %w", bin, err)
	}
	return fmt.Errorf("failed to start %s: %w", bin, err)
}

// reap waits for the process, kills what it left in its process group (as a container's
// processes end with its main process), records when it exited, stops watching Start's
// context, removes the temporary directory and deletes what the harness created in the
// cluster.
func (o *Operator) reap() {
	if ownGroup {
		waitExited(o.cmd)
		o.mu.Lock()
		killGroup(o.cmd)
		o.reaped = true
		o.mu.Unlock()
	}
	_ = o.cmd.Wait() // the exit status is in cmd.ProcessState
	o.mu.Lock()
	o.exitedAt = time.Now()
	o.mu.Unlock()
	o.stopCtx()
	_ = os.RemoveAll(o.tmp) // best effort: a file left in the temp dir is no failure of the spec
	if o.cleanupErr = o.cleanUp(); o.cleanupErr != nil {
		_, _ = fmt.Fprintln(o.opts.Output, o.opts.LogPrefix+"shutdowntest: "+o.cleanupErr.Error()) // Stop returns it too
	}
	close(o.exited)
}

// readLog copies the operator's output, line by line, into o.lines and opts.Output.
func (o *Operator) readLog(r *os.File) {
	defer close(o.logDone)
	defer func() { _ = r.Close() }()
	go func() { // bound the read: once the process is gone, wait a little, then stop reading
		select {
		case <-o.exited:
		case <-o.logDone:
			return
		}
		t := time.NewTimer(logDrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			_ = r.SetReadDeadline(time.Now())
		case <-o.logDone:
		}
	}()
	readLines(r, func(line string) {
		_, _ = fmt.Fprintln(o.opts.Output, o.opts.LogPrefix+line) // nowhere to report a failed write to
		o.mu.Lock()
		o.lines = append(o.lines, line)
		close(o.changed)
		o.changed = make(chan struct{})
		o.mu.Unlock()
	})
}

// kill sends SIGKILL to the operator's process group unless it was reaped.
func (o *Operator) kill() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.reaped {
		killGroup(o.cmd)
	}
}

// Endpoints returns the addresses of the operator's metrics and probe servers.
func (o *Operator) Endpoints() Endpoints { return o.endpoints }

// Done is closed once the operator's process exited, whatever ended it, and was reaped.
func (o *Operator) Done() <-chan struct{} { return o.exited }

// Pid returns the operator's process id.
func (o *Operator) Pid() int { return o.cmd.Process.Pid }

// Lines returns the operator's log so far, one string per line.
func (o *Operator) Lines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.lines...)
}

// WaitLines waits until n lines of the operator's log, from its start on, satisfy match
// (called once per line, on the caller's goroutine), e.g. until it logged that n reconciles
// work (for the lease, see WaitLeader). It returns nil then; an error when the log ended
// first (the operator exited: the error has its status and the count), or when ctx ends, or
// after Options.WaitTimeout (DefaultWaitTimeout) when ctx has no earlier deadline. It waits
// on the log itself, without polling.
func (o *Operator) WaitLines(ctx context.Context, n int, match func(line string) bool) error {
	return o.waitLines(ctx, fmt.Sprintf("%d matching log lines", n), n, match)
}

// LeaseAcquired is what client-go's leader election logs once it acquired the lease, in its
// words since v0.37 (controller-runtime v0.25); before, "successfully acquired lease".
// WaitLeader matches either case.
const LeaseAcquired = "Successfully acquired lease"

// WaitLeader waits until the operator logged that it acquired the leader-election lease
// (LeaseAcquired, in any case: client-go's line differs in case across controller-runtime
// v0.22 to v0.25), bounded as WaitLines is. Start returns once the operator is ready, which
// a standby is too: wait with WaitLeader for the leader.
func (o *Operator) WaitLeader(ctx context.Context) error {
	return o.waitLines(ctx, "the leader-election lease (a line "+strconv.Quote(LeaseAcquired)+", in any case)", 1,
		leaseAcquired)
}

// IsLeader reports whether the operator logged, so far, that it acquired the lease, as
// WaitLeader waits for: e.g. which of several replicas took over once the leader stopped.
func (o *Operator) IsLeader() bool {
	return slices.ContainsFunc(o.Lines(), leaseAcquired)
}

func leaseAcquired(line string) bool {
	return strings.Contains(strings.ToLower(line), strings.ToLower(LeaseAcquired))
}

// waitLines is WaitLines; what says what it waits for, in its errors.
func (o *Operator) waitLines(ctx context.Context, what string, n int, match func(line string) bool) error {
	ctx, cancel := context.WithTimeout(ctx, o.opts.WaitTimeout)
	defer cancel()
	seen, got := 0, 0
	count := func() <-chan struct{} {
		o.mu.Lock()
		lines, changed := o.lines[seen:len(o.lines):len(o.lines)], o.changed // append-only: safe to read unlocked
		o.mu.Unlock()
		for _, l := range lines {
			if match(l) {
				got++
			}
		}
		seen += len(lines)
		return changed
	}
	for {
		changed := count()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-o.exited:
			<-o.logDone
			if count(); got >= n {
				return nil
			}
			return fmt.Errorf("failed to wait for %s: the operator exited (%s) after %d", what, o.cmd.ProcessState, got)
		case <-ctx.Done():
			bound := ""
			if dl, _ := ctx.Deadline(); errors.Is(ctx.Err(), context.DeadlineExceeded) {
				bound = fmt.Sprintf(" until %s", dl.Format(time.TimeOnly))
			}
			return fmt.Errorf("failed to wait for %s%s (got %d, Options.WaitTimeout %s): %w",
				what, bound, got, o.opts.WaitTimeout, ctx.Err())
		}
	}
}

// PendingCount returns how many calls quiesce tracks in the operator right now: the count of
// GET /debug/quiesce (on Endpoints.Debug, or with Options.MetricsSecure on the metrics
// server; an error until the server listens). It captures no stacks, so it is cheap to
// poll. Wait for a state with it, e.g. in Gomega (whose default timeout, 1s, is short for an
// operator's start):
//
//	Eventually(op.PendingCount).WithContext(ctx).WithTimeout(time.Minute).Should(BeNumerically(">=", 3))
func (o *Operator) PendingCount(ctx context.Context) (int, error) {
	// limit=0: the count alone, without capturing the goroutines' stacks.
	count, _, err := o.debugState(ctx, "?limit=0")
	return count, err
}

// PendingCall is one call quiesce tracks in the operator, as GET /debug/quiesce lists it.
type PendingCall struct {
	Name        string        // e.g. "memcached/default/a/register"
	Age         time.Duration // how long it has run, as /debug/quiesce rounds it
	Detached    bool          // its caller stopped waiting; only the executor tracks it
	Daemon      bool          // a daemon (reconcilers.Daemons), never slow
	ReconcileID string        // the reconcile it belongs to, if any
	Where       string        // where its goroutine waits: "pkg.Func (file.go:123)"; "returning" once fn returned
	Handler     string        // the line in the operator's own code where it waits
}

// PendingCalls returns the calls quiesce tracks in the operator right now, oldest first
// (GET /debug/quiesce, as PendingCount; each request captures the goroutines' stacks,
// so poll PendingCount and read the calls once). E.g.:
//
//	calls, err := op.PendingCalls(ctx)
//	Expect(calls).To(ContainElement(HaveField("Name", HaveSuffix("/register"))))
func (o *Operator) PendingCalls(ctx context.Context) ([]PendingCall, error) {
	_, entries, err := o.debugState(ctx, "")
	if err != nil {
		return nil, err
	}
	calls := make([]PendingCall, 0, len(entries))
	for _, c := range entries {
		age, _ := time.ParseDuration(c.Age) // "": 0
		calls = append(calls, PendingCall{Name: c.Name, Age: age, Detached: c.Detached, Daemon: c.Daemon,
			ReconcileID: c.ReconcileID, Where: c.Where, Handler: c.Handler})
	}
	return calls, nil
}

// debugState GETs /debug/quiesce with query (on the secure metrics server, or on the debug
// listener) and returns its count and calls.
func (o *Operator) debugState(ctx context.Context, query string) (int, []internal.Entry, error) {
	url := o.debugURL() + runnable.DebugPath + query
	token, err := o.metricsToken(ctx)
	if err != nil {
		return 0, nil, err
	}
	body, status, err := get(ctx, o.http, url, token)
	if err != nil {
		return 0, nil, certHint(err)
	}
	if status != http.StatusOK {
		return 0, nil, fmt.Errorf("failed to get %s: status %d: %s", url, status, strings.TrimSpace(string(body)))
	}
	var state struct {
		Count *int             `json:"count"`
		Calls []internal.Entry `json:"calls"`
	}
	if err := json.Unmarshal(body, &state); err != nil || state.Count == nil {
		return 0, nil, fmt.Errorf("failed to read the pending calls from %s: %q", url, body)
	}
	return *state.Count, state.Calls, nil
}

// waitReady polls /readyz until it answers 200.
func (o *Operator) waitReady(ctx context.Context) error {
	deadline := time.NewTimer(o.opts.ReadyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(readyPollInterval)
	defer tick.Stop()
	url := "http://" + o.endpoints.Probe + "/readyz"
	var last string
	for {
		_, status, err := get(ctx, o.http, url, "")
		switch {
		case err == nil && status == http.StatusOK:
			return nil
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("status %d", status)
		}
		select {
		case <-o.exited:
			<-o.logDone
			return fmt.Errorf("failed to start the operator: it exited before it was ready (%s)%s; its log:\n%s",
				o.cmd.ProcessState, startHint(o.Lines()), logExcerpt(o.Lines()))
		case <-ctx.Done():
			return fmt.Errorf("failed to wait for the operator to be ready: %w", ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("failed to start the operator: GET %s did not answer 200 within %s "+
				"(last: %s); its log:\n%s", url, o.opts.ReadyTimeout, last, logExcerpt(o.Lines()))
		case <-tick.C:
		}
	}
}

// Stop sends the operator SIGTERM and waits for it to exit, up to StopTimeout; then it sends
// a second SIGTERM, and SIGKILL to its process group if it still runs StopTimeout (at most 5s)
// later (Result.Killed). SIGTERM goes to the operator alone, as the kubelet sends it to a
// container's main process: what the operator started is its own to stop; whatever of it
// remains in the operator's process group when the operator exits is killed then, as when a
// container's main process exits. Stop returns once the process and its log are done, with
// what happened. When ctx ends first, the operator is killed and Stop returns the Result and
// ctx's error. Stop on an operator that exited already (it crashed) returns its Result and an
// error that says so. A second Stop sends no second SIGTERM: it waits for the same exit, and
// kills the operator when its own ctx ends first. Stop also returns an error, with the
// Result, when the harness could read none of the operator's log lines (a logger in a format
// it does not read, or none): the error names the formats it reads and how to set one; and
// when it could not delete what it created in the cluster (Options.MetricsToken).
func (o *Operator) Stop(ctx context.Context) (*Result, error) {
	select {
	case <-o.exited:
		<-o.logDone
		res := o.result()
		return res, errors.Join(fmt.Errorf("failed to stop the operator: it had exited already (%s)", o.cmd.ProcessState),
			res.logErr, o.cleanupErr)
	default:
	}
	o.mu.Lock()
	first := o.signalAt.IsZero()
	if first {
		o.signalAt = time.Now()
		o.signaled = len(o.lines)
	}
	o.mu.Unlock()
	var timeout <-chan time.Time // the first Stop's: a second one waits for the same exit
	if first {
		if err := o.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			o.Kill()
			return o.result(), fmt.Errorf("failed to send SIGTERM to the operator: %w", err)
		}
		if o.opts.Service != nil {
			o.opts.Service.terminating(o) // as the pod's deletion reaches the endpoints
		}
		t := time.NewTimer(o.opts.StopTimeout)
		defer t.Stop()
		timeout = t.C
	}
	var errCtx error
	select {
	case <-o.exited:
	case <-ctx.Done():
		errCtx = fmt.Errorf("failed to wait for the operator to exit after SIGTERM (killed it): %w", ctx.Err())
		o.forceStop(false)
	case <-timeout:
		o.forceStop(true)
	}
	<-o.exited
	<-o.logDone
	res := o.result()
	return res, errors.Join(errCtx, res.logErr, o.cleanupErr)
}

// forceStop marks the stop as forced and ends the process: a second SIGTERM first when
// gently is set, then SIGKILL to its process group.
func (o *Operator) forceStop(gently bool) {
	o.mu.Lock()
	o.killed = true
	o.mu.Unlock()
	if gently && o.cmd.Process.Signal(syscall.SIGTERM) == nil {
		t := time.NewTimer(min(o.opts.StopTimeout, secondSignalWait))
		defer t.Stop()
		select {
		case <-o.exited:
			return
		case <-t.C:
		}
	}
	o.kill()
}

// Signal sends sig to the operator alone, e.g. a second SIGTERM while Stop waits
// (controller-runtime then exits at once with code 1). It fails once the operator exited.
func (o *Operator) Signal(sig os.Signal) error {
	select {
	case <-o.exited:
		return fmt.Errorf("failed to send %s: the operator exited (%s)", sig, o.cmd.ProcessState)
	default:
	}
	if err := o.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("failed to send %s: %w", sig, err)
	}
	return nil
}

// Kill ends the operator at once, with SIGKILL to its process group (the operator and every
// process it started), unless it exited, and waits until the process and its log are done.
// It never leaves a process: use it with DeferCleanup or t.Cleanup. It is a no-op once the
// operator exited (what the operator left in its group was killed then). What the harness
// created in the cluster is deleted once the operator exited, whichever way; Kill has no
// error to return: a failed deletion is written to Options.Output.
func (o *Operator) Kill() {
	o.kill()
	<-o.exited
	<-o.logDone
}

func (o *Operator) result() *Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	res := &Result{
		ExitCode: o.cmd.ProcessState.ExitCode(),
		Killed:   o.killed,
		Lines:    append([]string(nil), o.lines...),
		signaled: o.signaled,
	}
	if !o.signalAt.IsZero() {
		res.Took = o.exitedAt.Sub(o.signalAt)
	}
	res.GaveUp = res.gaveUp()
	res.Abandoned, res.AbandonedCount = abandoned(res.Lines)
	res.Timeline = timeline(res.Lines)
	res.logErr = logError(res.Lines)
	return res
}

// debugURL returns the URL, without a path, of the server of /debug/quiesce: the secure
// metrics server, or the debug listener.
func (o *Operator) debugURL() string {
	if o.opts.MetricsSecure {
		return "https://" + o.endpoints.Metrics
	}
	return "http://" + o.endpoints.Debug
}

// get GETs url with c, bounded by requestTimeout, with token as bearer token unless it is
// "", and returns its body and status.
func get(ctx context.Context, c *http.Client, url, token string) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("failed to create the request for %s: %w", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("failed to get %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end below, or failed: nothing to lose
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, 0, fmt.Errorf("failed to read the body of %s: %w", url, err)
	}
	return body, resp.StatusCode, nil
}

// freeAddr returns an address of host with a port free right now. Another process could
// take it before the operator binds it: the operator then fails to start, and Start says so.
func freeAddr(host string) (string, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("failed to find a free port: %w", err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("failed to free port %s: %w", addr, err)
	}
	return addr, nil
}

// logExcerpt returns, indented for an error, the log's first lines (where a bad flag is
// reported, before the usage) and its last ones (where a failed setup is), the rest left out.
func logExcerpt(lines []string) string {
	if len(lines) == 0 {
		return "\t(none)"
	}
	if len(lines) > headLinesInErrors+lastLinesInErrors {
		left := len(lines) - headLinesInErrors - lastLinesInErrors
		lines = append(append(lines[:headLinesInErrors:headLinesInErrors],
			fmt.Sprintf("... (%d lines left out)", left)), lines[len(lines)-lastLinesInErrors:]...)
	}
	return "\t" + strings.Join(lines, "\n\t")
}

// startHint says what to change when an operator's log shows a start failure with a known
// cause in the test's setup, "" otherwise.
func startHint(lines []string) string {
	for _, l := range lines {
		if strings.Contains(l, "serving-certs/tls.crt") && strings.Contains(l, "no such file") {
			return ": its webhook server found no certificate: the Environment installs no webhook " +
				"(set its WebhookInstallOptions.Paths to the operator's config/webhook, as a control plane " +
				"of its own for this spec; see docs/shutdowntest.md), or run the operator without webhooks " +
				"(e.g. kubebuilder's ENABLE_WEBHOOKS=false, with PassEnv)"
		}
	}
	return ""
}
