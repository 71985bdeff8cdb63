// Package runnable provides a controller-runtime manager.Runnable that owns a
// drain.Executor and drains it within a grace period when the manager stops.
//
// Add it to a manager with Add, before mgr.Start; pass its Executor to reconcilers.Wrap.
// Start blocks until the manager stops, then drains: it refuses new calls, waits up to
// GracePeriod for the tracked ones while the executor logs what it still waits for, and
// returns nil, or the *drain.PendingError naming the calls it abandoned (also logged as one
// error line). Err tells main, after mgr.Start returned, whether calls were abandoned.
//
// All methods are safe for concurrent use. A Runnable starts once.
//
// Add also registers a readyz check ("quiesce", failing from the moment the drain begins)
// and process-wide Prometheus metrics in controller-runtime's metrics.Registry:
// quiesce_calls_in_flight, quiesce_calls_started_total, quiesce_calls_refused_total,
// quiesce_calls_panicked_total, quiesce_calls_abandoned_total,
// quiesce_call_duration_seconds{controller} and quiesce_drain_duration_seconds.
package runnable
