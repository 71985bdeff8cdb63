// Package runnable provides a controller-runtime manager.Runnable that owns a
// drain.Executor and drains it within a grace period when the manager stops.
//
// Set it up in two calls: Setup on the manager's Options before ctrl.NewManager, then
// Runnable.Add on the manager (Add and ObserveLease, the setup of v0.2.0, still work); pass
// its Executor to reconcilers.Wrap:
//
//	q, err := runnable.Setup(cfg, &mgrOpts, qopts)
//	mgr, err := ctrl.NewManager(cfg, mgrOpts)
//	err = q.Add(mgr)
//	err = mgr.Start(q.StopContext(ctrl.SetupSignalHandler()))
//
// The Runnable needs no
// leader election: it runs on every replica, leader and standbys, and controller-runtime
// stops it first, with the other runnables of its group, and waits for it before it stops the
// leader-election group, the caches, the webhooks and the HTTP servers
// (pkg/manager/internal.go, engageStopProcedure). So the drain begins when the manager's stop
// begins, for every tracked call of the replica: it refuses new calls, waits up to
// GracePeriod for the tracked ones while the executor logs what it still waits for, and
// cancels their contexts at CancelAfter. If calls are still running when GracePeriod ends, it
// lists them in one error line, "Abandoned calls still running after the grace period" (the
// oldest 20 with name, age, detached, where and handler, and how many more). Err tells main,
// after mgr.Start returned, whether calls were abandoned.
//
// With leader election on, Setup (or ObserveLease), called on the manager's Options before
// ctrl.NewManager, lets quiesce watch the lease itself: the context of every tracked call
// ends, with the cause "leader election lost", when client-go's elector gives the lease up:
// RetryPeriod + RenewDeadline after the last successful renewal, and never later than
// LeaseDuration after it ("Leadership lost: cancelling calls"), whenever the lease is lost, and a
// replica whose stop began never acquires the lease. Add fails when leader election is on
// and the lease is not observed.
//
// All methods are safe for concurrent use; none blocks but Start. A Runnable starts once.
//
// Through a Runnable, in-flight reconciles get to finish: the drain cancels their contexts
// at 4/5 of GracePeriod, not at once (Options.CancelAfter; its zero value means the same in
// drain.Options: 4/5 of the time the drain is given).
//
// For rolling updates, Options.ShutdownDelay and StopContext delay the manager's stop
// itself: at SIGTERM readiness fails on every replica, and the whole manager keeps serving
// for the delay (mgr.Start(q.StopContext(ctx))). WebhookServer wraps the manager's webhook
// server so that each admission request is a tracked call with a context the stop does not
// cancel; the webhooks serve until the drain is over, and stop last. Each step logs one
// line with its offset from the stop, "sinceStop": "Stop began", "Shutdown delay over",
// "Draining executor", "All calls returned" (or the abandoned line), "Webhook server stopped".
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
// Here: Setup checks its Options and the manager's as Add does and returns an error (the
// manager's Options then as they were); Runnable.Add returns an error naming the fix for
// every order mistake it can see (the manager made before Setup or from other Options, the
// webhook server or leader election set after Setup, a second Add). Add checks its Options
// (no ManagerOptions, leader election without ObserveLease,
// negative ShutdownDelay, CancelAfter not below GracePeriod, GracePeriod not below the
// manager's GracefulShutdownTimeout, a second Add on one manager) and returns an error naming
// the value to change; a failed Add leaves the manager as it was. ObserveLease returns its
// errors too. New panics on a negative ShutdownDelay or a CancelAfter not below GracePeriod,
// and WebhookServer on a nil inner server.
//
// Add also registers:
//   - a readyz check, "quiesce", failing from SIGTERM on when there is a ShutdownDelay;
//   - the Runnable's ServeHTTP at /debug/quiesce on the manager's metrics server, behind
//     its FilterProvider like /metrics: the pending calls as JSON (with no FilterProvider,
//     only if Options.DebugWithoutFilter says so);
//   - process-wide Prometheus metrics in controller-runtime's metrics.Registry:
//     quiesce_calls_in_flight, quiesce_calls_started_total, quiesce_calls_refused_total,
//     quiesce_calls_panicked_total, quiesce_calls_abandoned_total,
//     quiesce_oldest_call_age_seconds, quiesce_calls_slow,
//     quiesce_call_duration_seconds{controller} (the controller given to reconcilers.Wrap;
//     "" for every other call) and quiesce_drain_duration_seconds.
//
// The metrics sum the executors of the Runnables that Add created and whose Start has not
// returned, plus the counters of those whose Start returned: these are kept as totals,
// and their executors are not held.
package runnable
