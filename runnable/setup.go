package runnable

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/internal"
)

// Setup prepares quiesce for the manager ctrl.NewManager(cfg, *mgrOpts) makes next, once
// mgrOpts is complete, and returns its Runnable for Runnable.Add. It changes two fields of
// *mgrOpts, the seams quiesce needs (docs/design.md, "Seams"):
//
//   - LeaderElectionResourceLockInterface, for fencing. With leader election on: the lock set,
//     or the one controller-runtime would build (on a copy of cfg or LeaderElectionConfig),
//     wrapped: the contexts of tracked calls end ("leader election lost") when client-go's
//     elector gives the lease up (RetryPeriod + RenewDeadline after the last renewal, at most
//     LeaseDuration) or another holder shows, and a replica whose stop began never acquires
//     the lease. Off: a lock controller-runtime ignores, unless leader election is turned on
//     after Setup; then it refuses the lease and Start fails, naming the fix.
//   - WebhookServer (nil: webhook.NewServer(webhook.Options{})), wrapped to track admission
//     (see Runnable.Add).
//
// With leader election on and the lease's namespace known (the lock's, or
// LeaderElectionNamespace), it also prepares the claims of reconcilers.HandOffAtStop, written
// with a clientset of the lease's rest.Config under the lock's identity (docs/design.md,
// "Handing over").
//
// It returns an error naming what to change, *mgrOpts unchanged, for nil mgrOpts, Options
// given to Setup already, bad opts, or a lease lock controller-runtime cannot build.
func Setup(cfg *rest.Config, mgrOpts *manager.Options, opts Options) (*Runnable, error) {
	if mgrOpts == nil {
		return nil, errors.New("failed to set up quiesce: nil manager Options " +
			"(pass &mgrOpts, the ctrl.Options given to ctrl.NewManager)")
	}
	if _, ok := mgrOpts.WebhookServer.(*webhookServer); ok {
		return nil, errors.New("failed to set up quiesce: these manager Options were given to runnable.Setup already " +
			"(call Setup once per manager, on the Options of that manager)")
	}
	err := errors.Join(checkDurations(opts), checkBudget(opts, mgrOpts), checkDebugAddress(opts))
	var lease *leaseObserver
	if err == nil && mgrOpts.LeaderElection {
		lease, err = observeLease(cfg, mgrOpts)
	}
	if err == nil {
		err = register()
	}
	if err != nil {
		return nil, fmt.Errorf("failed to set up quiesce: %w", err)
	}
	if internal.NoLogger(opts.Logger) && !internal.NoLogger(mgrOpts.Logger) {
		opts.Logger = mgrOpts.Logger.WithName("quiesce") // else withDefaults: log.Log's
	}
	r := newRunnable(withDefaults(opts), true)
	var lock resourcelock.Interface = &electionOff{r: r}
	if lease != nil {
		lease.r = r
		lock = lease
		r.claims = newClaims(lease, mgrOpts.LeaderElectionNamespace, r)
	}
	inner := mgrOpts.WebhookServer
	if internal.IsNil(inner) {
		inner = webhook.NewServer(webhook.Options{}) // controller-runtime's default
	}
	ws := &webhookServer{Server: inner, r: r}
	r.setup = &setupState{mgrOpts: mgrOpts, opts: opts, webhooks: ws, lease: lease, lock: lock}
	mgrOpts.LeaderElectionResourceLockInterface, mgrOpts.WebhookServer = lock, ws
	return r, nil
}

type setupState struct {
	mgrOpts  *manager.Options // as given to Setup, read again at Add
	opts     Options
	webhooks *webhookServer
	lease    *leaseObserver // nil with leader election off
	lock     resourcelock.Interface
	added    atomic.Bool
	attached atomic.Bool // set by Add before mgr.Add: Start refuses a Runnable without it
}

// checkDebugAddress refuses a DebugAddress that is not a loopback host and port.
func checkDebugAddress(opts Options) error {
	if opts.DebugAddress == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(opts.DebugAddress)
	if ip := net.ParseIP(host); err != nil || host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%s is %q: set a loopback host:port, e.g. 127.0.0.1:8083, and reach it with "+
			"kubectl port-forward (the debug view names objects and code lines: never serve it on the pod's network "+
			"without the metrics server's filter)", opts.name("DebugAddress"), opts.DebugAddress)
	}
	return nil
}

// listenDebug listens on opts.DebugAddress and refuses the listener unless its own address
// is loopback: a host name such as localhost may resolve to any address.
func listenDebug(opts Options) (net.Listener, error) {
	ln, err := net.Listen("tcp", opts.DebugAddress)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s for the quiesce debug view: %w", opts.name("DebugAddress"), err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
		_ = ln.Close()
		return nil, fmt.Errorf("failed to listen on %s for the quiesce debug view: %q listens on %s, not loopback: "+
			"set a loopback IP, e.g. 127.0.0.1:8083", opts.name("DebugAddress"), opts.DebugAddress, ln.Addr())
	}
	return ln, nil
}

// Add adds the Runnable of Setup to mgr, made by ctrl.NewManager(cfg, mgrOpts), once, before
// mgr.Start, with the readyz check "quiesce", the metrics, and ServeHTTP at DebugPath: on the
// metrics server when mgrOpts.Metrics has a FilterProvider, else not, saying so at V(1); and
// on Options.DebugAddress, stopped with the HTTP servers.
//
// The webhook server of Setup serves one manager. Each request is a tracked call from the
// start of ServeHTTP, named "webhook/<path>"; for an *admission.Webhook (its Handler wrapped
// in place at Register) the call is renamed "webhook/<path>/<namespace>/<name>" (generateName
// when it has no name; parts escaped with url.PathEscape, empty ones left out) from the
// admission.Request the Webhook decoded; quiesce reads no body. A call takes no
// MaxConcurrent slot, keeps a context the server's stop does not cancel, and from the stop on
// answers "Connection: close". The server stops after the drain; a request during the drain
// is served untracked. Once the drain began, a body still arriving is read until CancelAfter
// (at least a second more), then fails ("Webhook request body stalled"). A panic out of a
// handler is logged ("Webhook handler panicked"), counted and answered 500.
//
// Add fails, naming the fix, when WebhookServer, LeaderElection or the lock of mgrOpts
// changed since Setup, when GracePeriod is not below its GracefulShutdownTimeout, when
// DebugAddress cannot be listened on, or on a second Add. A manager not made from mgrOpts
// is seen by Start, once it leads.
func (r *Runnable) Add(mgr manager.Manager) error {
	s := r.setup
	switch {
	case mgr == nil:
		return errors.New("failed to add quiesce runnable: nil manager")
	case s == nil:
		return errors.New("failed to add quiesce runnable: it was not made by runnable.Setup " +
			"(call runnable.Setup before ctrl.NewManager)")
	case s.mgrOpts.WebhookServer != webhook.Server(s.webhooks) || s.mgrOpts.LeaderElection != (s.lease != nil) ||
		s.mgrOpts.LeaderElectionResourceLockInterface != s.lock:
		return errors.New("failed to add quiesce runnable: the manager's WebhookServer, LeaderElection or " +
			"LeaderElectionResourceLockInterface changed after runnable.Setup: call Setup once mgrOpts is complete")
	}
	if err := checkBudget(s.opts, s.mgrOpts); err != nil {
		return fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if !s.added.CompareAndSwap(false, true) {
		return errors.New("failed to add quiesce runnable: added already (call q.Add(mgr) once)")
	}
	if timeout, _ := shutdownTimeout(s.mgrOpts); timeout >= 0 {
		r.eventsBudget = min(maxEventsBudget, (timeout-r.grace)/2)
	}
	if err := r.attach(mgr); err != nil {
		s.added.Store(false)
		return err
	}
	return nil
}

// attach adds r to mgr; what can fail on a manager not started comes first.
func (r *Runnable) attach(mgr manager.Manager) error {
	s := r.setup
	switch m := s.mgrOpts.Metrics; {
	case m.BindAddress == "0":
		r.log.V(1).Info("Not serving /debug/quiesce: the manager's metrics server is off", "path", DebugPath,
			"howToServe", "set Options.DebugAddress (--quiesce-debug-address) to a loopback address")
	case m.FilterProvider == nil:
		r.log.V(1).Info("Not serving /debug/quiesce: the metrics server authenticates no one", "path", DebugPath,
			"howToServe", "set Metrics.FilterProvider (kubebuilder: --metrics-secure), "+
				"or Options.DebugAddress (--quiesce-debug-address) to a loopback address for kubectl port-forward")
	default:
		if err := mgr.AddMetricsServerExtraHandler(DebugPath, r); err != nil {
			return fmt.Errorf("failed to add quiesce debug handler at %s: %w", DebugPath, err)
		}
	}
	if err := mgr.AddReadyzCheck("quiesce", r.ReadyzCheck); err != nil {
		return fmt.Errorf("failed to add quiesce readyz check: %w", err)
	}
	var debug *manager.Server
	if addr := s.opts.DebugAddress; addr != "" {
		ln, err := listenDebug(s.opts)
		if err != nil {
			return err
		}
		r.log.Info("Serving the debug view on loopback", "address", ln.Addr().String(), "path", DebugPath)
		mux := http.NewServeMux()
		mux.Handle(DebugPath, r)
		timeout := time.Second
		debug = &manager.Server{Name: "quiesce-debug", Listener: ln, ShutdownTimeout: &timeout,
			Server: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	}
	if s.lease != nil { // before mgr.Add, which may start r at once
		r.elected = mgr.Elected()
		r.lease.Store(s.lease)
	}
	stats.track(r) // before mgr.Add: a drain over before it would leave r tracked for good
	s.attached.Store(true)
	if err := mgr.Add(r); err != nil {
		stats.fold(r)
		if debug != nil {
			_ = debug.Listener.Close()
		}
		return fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if debug != nil {
		if err := mgr.Add(debug); err != nil {
			_ = debug.Listener.Close()
			return fmt.Errorf("failed to add quiesce debug server: %w", err)
		}
	}
	if s.lease != nil {
		s.lease.events.connect(mgr)
	}
	return nil
}
