// Package runnable provides a controller-runtime manager.Runnable that owns a drain.Executor
// and drains it within a grace period when the manager stops.
package runnable
