// Package reconcilers wraps controller-runtime reconcilers so that each Reconcile, and each
// blocking handler call inside it, runs as a tracked call of a drain.Executor: the drain
// waits for them at shutdown and names those that hang.
//
// Wrap and WrapTyped track each reconcile; Call, inside one, tracks a blocking handler and
// waits for it (if the reconcile's context ends first, Call returns and the handler stays
// tracked). Once a runnable.Runnable drives the executor, a wrapped reconcile's context ends
// when the drain cancels it, not when controller-runtime begins to stop, and new requests
// are requeued instead of run; a reconcile in flight when the drain begins finishes, its
// Calls run. With WrapOptions.Stop set to CancelAtStop (idempotent controllers), the
// drain cancels the controller's reconciles in flight as it begins instead, and requeues
// them quietly, so that the stop need not wait for them (docs/stop-policy.md). With
// WrapOptions.Recorder, a slow or abandoned reconcile records a Warning Event on its object.
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
// Setup misuse, one rule in every quiesce package: a function that can report an error (an
// error result, a test's TestingT, a Gomega matcher's error) reports every misuse of its
// arguments and options that way, naming what to change; a function that cannot (a
// constructor used inline, as reconcilers.Wrap in SetupWithManager) panics on misuse, at
// the call, with a message naming the function and what to change: a programming error,
// found at setup, as regexp.MustCompile finds one. Nothing found at setup is left for run
// time. A typed nil (a nil *events.FakeRecorder as a Recorder, a nil *FakeClock as a Clock,
// a Logger whose sink is a nil pointer) is nil: it means what leaving it unset means.
//
// Here: Wrap and WrapTyped panic on a foreign executor, a nil reconciler, an empty
// controller name, an unknown Stop, or a Recorder without Reader and Object; a nil executor is no misuse:
// it means untracked (the reconciler runs as given, and logs so once). NewDaemons panics on
// a nil or foreign executor. Call, Daemons.Ensure and Daemons.Stop return errors wrapping
// drain.ErrInvalidCall for an empty name, a nil fn or object, an object without UID.
//
// Call blocks while its handler runs, and Daemons.Stop up to its StopTimeout; nothing else
// blocks. The reconcilers returned, Call and Daemons are safe for concurrent use.
package reconcilers
