// Package reconcilers wraps controller-runtime reconcilers so that each Reconcile, and each
// blocking handler call inside it, runs as a tracked call of a drain.Executor: the drain
// waits for them at shutdown and names those that hang.
//
// Wrap and WrapTyped track each reconcile; Call, inside one, tracks a blocking handler and
// waits for it (if the reconcile's context ends first, Call returns and the handler stays
// tracked). Once a runnable.Runnable drives the executor, a wrapped reconcile's context ends
// when the drain cancels it, not when controller-runtime begins to stop, and new requests
// are requeued instead of run. With WrapOptions.Recorder, a slow or abandoned reconcile records
// a Warning Event on its object.
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
// Call blocks while its handler runs, and Daemons.Stop up to its StopTimeout; nothing else
// blocks. The reconcilers returned, Call and Daemons are safe for concurrent use.
package reconcilers
