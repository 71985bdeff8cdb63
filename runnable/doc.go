// Package runnable provides a controller-runtime manager.Runnable that owns a drain.Executor
// and drains it within a grace period when the manager stops. Set it up in main.go:
//
//	q, err := runnable.Setup(cfg, &mgrOpts, qopts) // before ctrl.NewManager
//	mgr, err := ctrl.NewManager(cfg, mgrOpts)
//	err = q.Add(mgr)
//	// ...reconcilers.Wrap(q.Executor(), "memcached", r, reconcilers.WrapOptions{})
//	err = mgr.Start(q.StopContext(ctrl.SetupSignalHandler()))
//	if q.Err() != nil { os.Exit(1) } // calls were abandoned
//
// New makes a Runner without a manager, for unit tests and libraries: it is not a
// manager.Runnable (docs/design.md says why).
//
// The Runnable needs no leader election: it runs on every replica, and controller-runtime
// stops it first and waits for it before the leader-election group, the caches, the webhooks
// and the HTTP servers (pkg/manager/internal.go, engageStopProcedure). Its drain refuses new
// calls, waits up to GracePeriod for every tracked call of the replica, cancels their
// contexts at CancelAfter, and names what it abandons in one line, AbandonedMessage. Each
// step of the stop logs one line with "sinceStop".
//
// The shield: after SIGTERM the context of a reconcile wrapped with its executor ignores
// controller-runtime's cancellation and ends by the drain (CancelAfter, at most GracePeriod)
// or by the fence, and the leader-election workers are held until the drain ends. Fencing
// (see Setup): the contexts of tracked calls end ("leader election lost") when client-go's
// elector gives the lease up, and a replica whose stop began never acquires it. With an
// elector of the operator's own, WrapLock wraps its lock for the same fence, and LeaseLost
// fences at once (docs/adoption.md, "Your own leader election").
//
// Setup misuse, one rule in every quiesce package: a function that can report an error (an
// error result, a test's TestingT, a Gomega matcher's error) reports every misuse of its
// arguments and options that way, naming what to change; a function that cannot (a
// constructor used inline, as reconcilers.Wrap in SetupWithManager) panics on misuse, at
// the call, with a message naming the function and what to change: a programming error,
// found at setup, as regexp.MustCompile finds one. Nothing found at setup is left for run
// time. A typed nil (a nil *events.FakeRecorder as a Recorder, a nil *FakeClock as a Clock,
// a Logger whose sink is a nil pointer) is nil: it means what leaving it unset means.
//
// Here: Setup and Runnable.Add return errors naming what to change (the field, its flag or
// its config path); New panics on the same values; a Start that finds the manager not made
// from the Options of Setup returns such an error, and mgr.Start with it.
//
// Add registers a readyz check "quiesce", /debug/quiesce (ServeHTTP) and process-wide
// metrics in controller-runtime's metrics.Registry: quiesce_calls_in_flight,
// quiesce_calls_started_total, quiesce_calls_refused_total, quiesce_calls_panicked_total,
// quiesce_calls_abandoned_total, quiesce_calls_cancelled_total, quiesce_calls_slow,
// quiesce_oldest_call_age_seconds, quiesce_call_duration_seconds{controller} and
// quiesce_drain_duration_seconds, summed over the Runnables of Setup (each until its Start
// returned, then its counters only). All methods are safe for concurrent use; none blocks
// but Start.
package runnable
