package runnable

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/quiesce-dev/quiesce/internal"
)

// Setup prepares quiesce for the manager that ctrl.NewManager(cfg, *mgrOpts) makes next,
// and returns its Runnable, not yet added: call it once the manager's Options are complete,
// then Runnable.Add after ctrl.NewManager, and start the manager on StopContext:
//
//	q, err := runnable.Setup(cfg, &mgrOpts, qopts)
//	mgr, err := ctrl.NewManager(cfg, mgrOpts)
//	err = q.Add(mgr)
//	err = mgr.Start(q.StopContext(ctrl.SetupSignalHandler()))
//
// Setup checks opts (as Add does) against *mgrOpts and changes nothing it is given but
// these fields of *mgrOpts, each so that the manager behaves as it would without quiesce:
//
//   - LeaderElectionResourceLockInterface, with LeaderElection on: the lease observer (see
//     ObserveLease; the lock is built on a copy of cfg, as controller-runtime builds it);
//   - WebhookServer: wrapped by WebhookServer (nil: controller-runtime's default,
//     webhook.NewServer(webhook.Options{}), wrapped), so that admission requests are tracked;
//   - NewClient (nil: client.New) and Metrics.FilterProvider (if set): wrapped to call the
//     function they held, unchanged, so that Runnable.Add knows that the manager was made
//     from these Options, and serves DebugPath only when the manager's real metrics server
//     filters its requests.
//
// It returns an error naming what to change when mgrOpts is nil, when opts are invalid
// (see Add), or when these Options were given to Setup already; *mgrOpts is then as it
// was. Options.ManagerOptions is ignored: Setup keeps mgrOpts. The Runnable's Executor may
// be handed to reconcilers.Wrap from now on.
func Setup(cfg *rest.Config, mgrOpts *manager.Options, opts Options) (*Runnable, error) {
	if mgrOpts == nil {
		return nil, errors.New("failed to set up quiesce: nil manager Options " +
			"(pass &mgrOpts, the ctrl.Options given to ctrl.NewManager)")
	}
	if ws, ok := mgrOpts.WebhookServer.(*webhookServer); ok && ws.fromSetup {
		return nil, errors.New("failed to set up quiesce: these manager Options were given to runnable.Setup already " +
			"(call Setup once per manager, on the Options of that manager)")
	}
	opts.ManagerOptions = mgrOpts
	if err := checkTimeouts(opts); err != nil {
		return nil, fmt.Errorf("failed to set up quiesce: %w", err)
	}
	// Everything that can fail comes before the first change to *mgrOpts.
	lock := mgrOpts.LeaderElectionResourceLockInterface
	if mgrOpts.LeaderElection {
		o := *mgrOpts
		if err := ObserveLease(cfg, &o); err != nil {
			return nil, fmt.Errorf("failed to set up quiesce: %w", err)
		}
		lock = o.LeaderElectionResourceLockInterface
	}
	if internal.NoLogger(opts.Logger) {
		opts.Logger = mgrOpts.Logger // the manager's logger, as Add takes mgr.GetLogger()
		if internal.NoLogger(opts.Logger) {
			opts.Logger = logf.Log
		}
		opts.Logger = opts.Logger.WithName("quiesce")
	}
	if err := register(); err != nil {
		return nil, err
	}
	opts = withDefaults(opts)
	r := newRunnable(opts, true)
	s := &setupState{opts: mgrOpts, debugWithoutFilter: opts.DebugWithoutFilter}

	// The changes, documented above.
	mgrOpts.LeaderElectionResourceLockInterface = lock
	if internal.IsNil(mgrOpts.WebhookServer) {
		mgrOpts.WebhookServer = webhook.NewServer(webhook.Options{}) // controller-runtime's default
	}
	ws, ok := mgrOpts.WebhookServer.(*webhookServer)
	if !ok {
		ws = WebhookServer(mgrOpts.WebhookServer).(*webhookServer)
	}
	ws.fromSetup = true
	mgrOpts.WebhookServer = ws
	newClient := mgrOpts.NewClient
	if newClient == nil {
		newClient = client.New // controller-runtime's default
	}
	mgrOpts.NewClient = madeCheck{made: &s.made, inner: newClient}.newClient
	if filter := mgrOpts.Metrics.FilterProvider; filter != nil {
		s.filter = true
		mgrOpts.Metrics.FilterProvider = func(c *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
			s.filtered.Store(true)
			return filter(c, hc)
		}
	}
	s.lock, s.webhooks = lock, mgrOpts.WebhookServer
	r.setup = s
	return r, nil
}

// setupState is what Setup prepared, for Runnable.Add.
type setupState struct {
	opts               *manager.Options // the Options given to Setup
	lock               any              // their lock and webhook server as Setup left them
	webhooks           webhook.Server
	filter             bool        // Metrics.FilterProvider was set, and wrapped
	debugWithoutFilter bool        // Options.DebugWithoutFilter
	made               atomic.Bool // NewClient was called: a manager was made from the Options
	filtered           atomic.Bool // the FilterProvider was called: the metrics server filters
	added              atomic.Bool
}

// madeCheck is the NewClient that Setup installs: it records that a manager (a cluster)
// was made from the Options, and calls the NewClient they held.
type madeCheck struct {
	made  *atomic.Bool
	inner client.NewClientFunc
}

func (m madeCheck) newClient(c *rest.Config, o client.Options) (client.Client, error) {
	m.made.Store(true)
	return m.inner(c, o)
}

// errSetupOrder names the fix for a manager that was not made from the Options Setup prepared.
var errSetupOrder = errors.New("the manager was not made from the Options given to runnable.Setup: " +
	"call q, err := runnable.Setup(cfg, &mgrOpts, opts) before ctrl.NewManager(cfg, mgrOpts), with the same mgrOpts")

// Add adds the Runnable that Setup returned to mgr, the manager made by
// ctrl.NewManager(cfg, mgrOpts) from the Options given to Setup: with its readyz check,
// metrics, DebugPath, the lease observer and the webhook server, as the function Add does.
// Call it once, before mgr.Start.
//
// It returns an error naming the fix when the Runnable did not come from Setup, when mgr
// was not made from the Options given to Setup (Setup called after ctrl.NewManager, or
// ctrl.NewManager given other Options), when those Options changed after Setup in a way
// quiesce cannot follow (leader election turned on, another webhook server), when
// GracePeriod is not below their GracefulShutdownTimeout, or on a second Add. DebugPath is
// served behind the metrics server's filter only when the manager's metrics server really
// called the FilterProvider Setup saw (or, with none, when Options.DebugWithoutFilter says
// so); otherwise it logs once, at V(1), why not.
func (r *Runnable) Add(mgr manager.Manager) error {
	s := r.setup
	switch {
	case mgr == nil:
		return errors.New("failed to add quiesce runnable: nil manager")
	case s == nil:
		return errors.New("failed to add quiesce runnable: it was not made by runnable.Setup " +
			"(call runnable.Setup before ctrl.NewManager, or runnable.Add(mgr, opts) for a Runnable of its own)")
	case !s.made.Load():
		return fmt.Errorf("failed to add quiesce runnable: %w", errSetupOrder)
	case s.opts.LeaderElection && (s.opts.LeaderElectionResourceLockInterface != s.lock || !isObserver(s.lock)):
		return errors.New("failed to add quiesce runnable: leader election was turned on, or its lock changed, " +
			"after runnable.Setup: call Setup once the manager's Options are complete")
	case s.opts.WebhookServer != s.webhooks:
		return errors.New("failed to add quiesce runnable: the manager's WebhookServer was set after runnable.Setup: " +
			"set mgrOpts.WebhookServer before calling Setup, which wraps it")
	}
	if err := checkTimeouts(Options{GracePeriod: r.grace, ManagerOptions: s.opts}); err != nil {
		return fmt.Errorf("failed to add quiesce runnable: %w", err)
	}
	if !s.added.CompareAndSwap(false, true) {
		return errors.New("failed to add quiesce runnable: added already (call q.Add(mgr) once)")
	}
	r.eventsBudget = eventsBudget(r.grace, s.opts)
	ws, _ := s.webhooks.(*webhookServer)
	lease, _ := s.lock.(*leaseObserver)
	if !s.opts.LeaderElection {
		lease = nil
	}
	if err := r.attach(mgr, ws, lease, r.setupDebugServed(s)); err != nil {
		s.added.Store(false)
		return err
	}
	return nil
}

func isObserver(lock any) bool {
	_, ok := lock.(*leaseObserver)
	return ok
}

// setupDebugServed reports whether Runnable.Add serves DebugPath: decided from the metrics
// server the manager made, and logs once, at V(1), why not.
func (r *Runnable) setupDebugServed(s *setupState) bool {
	switch {
	case s.opts.Metrics.BindAddress == "0":
		r.log.V(1).Info("Not serving /debug/quiesce: the manager's metrics server is off", "path", DebugPath)
		return false
	case s.filtered.Load():
		return true
	case s.filter:
		// The FilterProvider was not called: the manager runs no metrics server of these Options.
		r.log.V(1).Info("Not serving /debug/quiesce: the manager's metrics server did not use the FilterProvider "+
			"of the Options given to runnable.Setup", "path", DebugPath)
		return false
	case !s.debugWithoutFilter:
		r.log.V(1).Info("Not serving /debug/quiesce: the metrics server authenticates no one", "path", DebugPath,
			"howToServe", "set Metrics.FilterProvider (kubebuilder: --metrics-secure), "+
				"or Options.DebugWithoutFilter to serve it to anyone who reaches the metrics port")
		return false
	}
	return true
}
