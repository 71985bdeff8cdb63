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
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/internal"
)

// Setup prepares quiesce for the manager that ctrl.NewManager(cfg, *mgrOpts) makes next and
// returns its Runnable, to be added with Runnable.Add once the manager exists:
//
//	q, err := runnable.Setup(cfg, &mgrOpts, qopts)
//	mgr, err := ctrl.NewManager(cfg, mgrOpts)
//	err = q.Add(mgr)
//	err = mgr.Start(q.StopContext(ctrl.SetupSignalHandler()))
//
// Call it once the manager's Options are complete. It changes two fields of *mgrOpts, the
// only seams of the manager quiesce touches (docs/design.md, "Seams"):
//
//   - LeaderElectionResourceLockInterface, for fencing. With LeaderElection on: the lock
//     controller-runtime would build (from the LeaderElection* fields, on a copy of cfg or
//     of LeaderElectionConfig), or the one set, wrapped so that quiesce sees each renewal:
//     the contexts of tracked calls end ("leader election lost") when client-go's elector
//     gives the lease up (RetryPeriod + RenewDeadline after the last renewal, at most
//     LeaseDuration) or another holder shows, and a replica whose stop began never acquires
//     the lease. With LeaderElection off: a lock that controller-runtime ignores, unless
//     leader election is turned on after Setup; then it refuses the lease and Start returns
//     an error naming the fix.
//   - WebhookServer (nil: controller-runtime's default, webhook.NewServer(webhook.Options{})),
//     wrapped so that admission requests are tracked calls (see Runnable.Add).
//
// It returns an error naming what to change, leaving *mgrOpts as it was, for nil mgrOpts,
// Options given to Setup already, bad opts (negative ShutdownDelay, CancelAfter not below
// GracePeriod, GracePeriod not below GracefulShutdownTimeout, intervals below drain's
// minimums, a DebugAddress that is not loopback) and a lease lock controller-runtime
// cannot build. The Runnable's Executor may be handed to reconcilers.Wrap from now on.
func Setup(cfg *rest.Config, mgrOpts *manager.Options, opts Options) (*Runnable, error) {
	if mgrOpts == nil {
		return nil, errors.New("failed to set up quiesce: nil manager Options " +
			"(pass &mgrOpts, the ctrl.Options given to ctrl.NewManager)")
	}
	if _, ok := mgrOpts.WebhookServer.(*webhookServer); ok {
		return nil, errors.New("failed to set up quiesce: these manager Options were given to runnable.Setup already " +
			"(call Setup once per manager, on the Options of that manager)")
	}
	err := checkDurations(opts)
	if err == nil {
		err = checkBudget(opts, mgrOpts)
	}
	if err == nil {
		err = checkDebugAddress(opts)
	}
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
	if internal.NoLogger(opts.Logger) {
		opts.Logger = mgrOpts.Logger
		if internal.NoLogger(opts.Logger) {
			opts.Logger = logf.Log
		}
		opts.Logger = opts.Logger.WithName("quiesce")
	}
	r := newRunnable(withDefaults(opts), true)
	var lock resourcelock.Interface = &electionOff{r: r}
	if lease != nil {
		lease.r = r
		lock = lease
	}
	inner := mgrOpts.WebhookServer
	if internal.IsNil(inner) {
		inner = webhook.NewServer(webhook.Options{}) // controller-runtime's default
	}
	ws := &webhookServer{inner: inner, r: r}
	r.setup = &setupState{mgrOpts: mgrOpts, opts: opts, webhooks: ws, lease: lease, lock: lock}
	mgrOpts.LeaderElectionResourceLockInterface, mgrOpts.WebhookServer = lock, ws
	return r, nil
}

// setupState is what Setup prepared, for Runnable.Add.
type setupState struct {
	mgrOpts  *manager.Options // as given to Setup, read again at Add
	opts     Options
	webhooks *webhookServer
	lease    *leaseObserver // nil with leader election off
	lock     resourcelock.Interface
	added    atomic.Bool
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

// Add adds the Runnable that Setup returned to mgr, made by ctrl.NewManager(cfg, mgrOpts)
// from the Options given to Setup, with:
//   - the readyz check "quiesce" (ReadyzCheck);
//   - ServeHTTP at DebugPath on the manager's metrics server when, in the Options given to
//     Setup as they are now, the metrics server is on and has a Metrics.FilterProvider
//     (authentication and authorization, as for /metrics), or DebugWithoutFilter is set;
//     otherwise it logs why not, once, at V(1). A copy of the Options that drops the filter
//     after Setup is not detected: set the filter before Setup;
//   - a listener of its own at Options.DebugAddress, serving DebugPath, stopped with the
//     manager's HTTP servers (last);
//   - process-wide metrics in controller-runtime's metrics.Registry (see the package doc).
//
// The webhook server that Setup wrapped then tracks each admission request as a call named
// "webhook/<path>/<namespace>/<name>" (the object's generateName when it has no name yet;
// empty parts left out), read from the AdmissionReview (at most 7 MiB, as
// controller-runtime reads it; the body is passed on as it came), or "webhook/<path>" for
// other requests (conversion webhooks). Its calls take no MaxConcurrent slot and keep a
// context that the server's stop does not cancel (the drain bounds them); from the stop on
// responses carry "Connection: close" so that the API server's connections move to another
// replica; it serves until the manager stops the webhooks, after this replica's drain, and
// a request that arrives once the drain began is served untracked. A handler that panics
// out of ServeHTTP is logged ("Webhook handler panicked", with the call's name and stack),
// counted, and answered 500; http.ErrAbortHandler still aborts the response. Handlers
// added to WebhookMux directly are served untracked.
//
// Add returns an error naming the fix when mgr's webhook server is not the one Setup
// prepared (the manager was made before Setup, or from other Options, or WebhookServer was
// set after Setup), when GracePeriod is no longer below the GracefulShutdownTimeout of the
// Options given to Setup, when DebugAddress cannot be listened on, or on a second Add.
// Call it once, before mgr.Start. A manager made from the same Options without Add fails
// to start: its webhook server serves one manager.
func (r *Runnable) Add(mgr manager.Manager) error {
	s := r.setup
	switch {
	case mgr == nil:
		return errors.New("failed to add quiesce runnable: nil manager")
	case s == nil:
		return errors.New("failed to add quiesce runnable: it was not made by runnable.Setup " +
			"(call runnable.Setup before ctrl.NewManager; runnable.New is for use without a manager)")
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
	r.eventsBudget = eventsBudget(r.grace, s.mgrOpts)
	if err := r.attach(mgr); err != nil {
		s.added.Store(false)
		return err
	}
	return nil
}

// attach adds r to mgr: the steps that can fail on a manager not started come first.
func (r *Runnable) attach(mgr manager.Manager) error {
	s := r.setup
	if r.debugOnMetrics() {
		if err := mgr.AddMetricsServerExtraHandler(DebugPath, r); err != nil {
			return fmt.Errorf("failed to add quiesce debug handler at %s: %w", DebugPath, err)
		}
	}
	if err := mgr.AddReadyzCheck("quiesce", r.ReadyzCheck); err != nil {
		return fmt.Errorf("failed to add quiesce readyz check: %w", err)
	}
	var debug *manager.Server
	if addr := s.opts.DebugAddress; addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("failed to listen on %s for the quiesce debug view: %w", s.opts.name("DebugAddress"), err)
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
	// Tracked before mgr.Add: a drain over before it was tracked would leave it tracked for good.
	stats.track(r)
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
	if s.lease != nil && s.lease.events.cluster == nil {
		// The elector's Events ("became leader"), where controller-runtime records them.
		rec := mgr.GetEventRecorderFor(s.lease.Identity())
		s.lease.events.to.Store(&rec)
	}
	return nil
}

// debugOnMetrics reports whether Add serves DebugPath on the metrics server, and logs once,
// at V(1), why not.
func (r *Runnable) debugOnMetrics() bool {
	m, s := r.setup.mgrOpts.Metrics, r.setup
	switch {
	case m.BindAddress == "0":
		r.log.V(1).Info("Not serving /debug/quiesce: the manager's metrics server is off", "path", DebugPath,
			"howToServe", "set Options.DebugAddress (--quiesce-debug-address) to a loopback address")
		return false
	case m.FilterProvider == nil && !s.opts.DebugWithoutFilter:
		r.log.V(1).Info("Not serving /debug/quiesce: the metrics server authenticates no one", "path", DebugPath,
			"howToServe", "set Metrics.FilterProvider (kubebuilder: --metrics-secure), "+
				"or Options.DebugAddress (--quiesce-debug-address) to a loopback address for kubectl port-forward")
		return false
	}
	return true
}
