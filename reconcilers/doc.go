// Package reconcilers wraps controller-runtime reconcilers so that each Reconcile, and each
// blocking handler call inside it, runs as a tracked call of a drain.Executor.
package reconcilers
