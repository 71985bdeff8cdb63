// Package reconcilers wraps controller-runtime reconcilers so that each Reconcile, and each
// blocking handler call inside it, runs as a tracked call of a drain.Executor: the drain
// waits for them at shutdown and names those that hang.
//
// Wrap and WrapTyped track each reconcile (its context under a runnable.Runnable, its stop
// policy, its Events: see Wrap); Call, inside one, tracks a blocking handler. Daemons runs
// kopf-style long-lived functions per object. lifecycle's Handlers build kopf's handler
// model on Wrap and Call.
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
// controller name, an unknown Stop, a Recorder without Reader and Object, a Recorder, an
// OnAbandon or HandOffAtStop with requests other than reconcile.Request, HandOffAtStop without
// the executor of runnable.Setup with leader election on, or a Cleanup that cannot fit the
// grace period of the Runnable that owns the executor; a nil executor
// means untracked (logged once). NewDaemons panics on a nil or foreign executor. Call,
// Ensure and Stop return errors wrapping drain.ErrInvalidCall for an empty name, a nil fn or
// object, an object without UID.
//
// Call blocks while its handler runs, Daemons.Stop up to its StopTimeout; nothing else
// blocks. Everything here is safe for concurrent use.
package reconcilers
