// Package reconcilers wraps controller-runtime reconcilers so that each Reconcile, and each
// blocking handler call inside it, runs as a tracked call of a drain.Executor.
//
// Wrap and WrapTyped name each reconcile "<controller>/<namespace>/<name>"; Call, inside a
// wrapped reconcile, runs a blocking handler as a tracked call named
// "<controller>/<namespace>/<name>/<handler>" and waits for it (if the reconcile's context
// ends first, Call returns and the handler stays tracked, reported as detached); outside one
// it runs the handler directly. Once a runnable.Runnable drives the executor (runnable.Add,
// or Start; runnable.New alone does not), a wrapped reconcile's context ends when the drain
// cancels it (drain.Options.CancelAfter), not when controller-runtime begins to stop; it
// keeps its deadline. A panic in a wrapped reconcile, or in a Call it waits for, reaches
// controller-runtime on the reconcile's goroutine as it would unwrapped (a Call's as a
// *drain.PanicError carrying the handler's value and stack); a panic nobody waits for is
// logged by the executor. Once the executor drains, new requests are requeued instead of
// run, and so is a request whose context controller-runtime had already cancelled.
// Reports name each call with controller-runtime's reconcileID.
//
// Daemons runs long-lived functions per object, kopf-style: Ensure, called from Reconcile
// while the object exists, starts one per object and daemon name as a tracked call
// "<controller>/<namespace>/<name>/<daemon>" on a goroutine of its own, restarted with a
// backoff when it fails; Stop, once the object is being deleted, ends its context and waits
// for it. The drain ends every daemon's context the moment it begins and waits for them.
//
// Several named handlers per object, their progress kept on it (kopf's handler model), are
// package lifecycle's Handlers, built on Wrap and Call.
//
// The reconcilers returned are safe for concurrent use, as controller-runtime requires, and
// so is Daemons.
package reconcilers
