// Package runnable provides a controller-runtime manager.Runnable that owns a
// drain.Executor and drains it within a grace period when the manager stops.
//
// Add it to a manager with Add, before mgr.Start; pass its Executor to reconcilers.Wrap.
// Start blocks until the manager stops, then drains: it refuses new calls, waits up to
// GracePeriod for the tracked ones while the executor logs what it still waits for, and
// returns nil. If calls are still running when GracePeriod ends, it lists them in one
// error line, "Abandoned calls still running after the grace period" (the oldest 20 with
// name, age, detached, where and handler, and how many more), and returns an error that
// counts them and wraps the *drain.PendingError naming each one. Err tells main, after
// mgr.Start returned, whether calls were abandoned.
//
// All methods are safe for concurrent use; none blocks but Start. A Runnable starts once.
//
// Through a Runnable, in-flight reconciles get to finish: the drain cancels their contexts
// at 4/5 of GracePeriod, not at once (Options.CancelAfter, Options.CancelAtOnce).
//
// For rolling updates, Add also adds a stop procedure that runs on every replica, leader and
// standbys (it does not need leader election, and controller-runtime stops such runnables
// first and waits for them): when the manager's stop begins, readiness fails at once, the
// manager keeps serving for Options.ShutdownDelay, then the WebhookServer's listener closes
// and the drain proceeds (on a standby, the stop procedure drains the executor itself, which
// tracks the webhook calls). Each step logs one line with its offset from the stop,
// "sinceStop": "Stop began", "Shutdown delay over", "Closing webhook listener", "Draining
// executor", "All calls returned" (or the abandoned line), "Webhook server stopped".
// WebhookServer wraps the manager's webhook server so that each admission request is a
// tracked call with a context the stop does not cancel.
//
// Add checks its Options (negative ShutdownDelay, CancelAfter not below GracePeriod,
// ShutdownDelay + GracePeriod not below the manager's GracefulShutdownTimeout, a second Add
// on one manager) and returns an error naming the value to change.
//
// Add also registers:
//   - a readyz check, "quiesce", failing from the moment the drain begins;
//   - the Runnable's ServeHTTP at /debug/quiesce on the manager's metrics server, behind
//     its FilterProvider like /metrics: the pending calls as JSON;
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
