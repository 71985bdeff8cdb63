// Package lifecycle holds handler-selection functions: given the handlers still to run, a
// lifecycle picks those to run in this cycle.
//
// A reconciler of several named handlers (see package reconcilers) keeps, per object, which
// handlers are done and how often each was retried. On every reconcile it passes the ids of the
// handlers not yet done, in registration order, together with that progress, to a [Func], and
// runs the handlers the Func returns. The package offers the strategies of the Python operator
// framework kopf, under the same names: [AllAtOnce], [OneByOne], [Randomized], [Shuffled] and
// [ASAP], the default.
//
// The functions are pure: they read their arguments, never modify them, and return a new slice.
// They do not block, do no I/O, and are safe for concurrent use by multiple goroutines; the
// random ones draw from the goroutine-safe top-level source of math/rand/v2.
//
// A lifecycle is called inline, in the reconciling goroutine, and never through the tracked
// executor of package drain. This is deliberate, as in kopf, whose lifecycles are plain functions
// and never go to its thread pool: the executor exists to track blocking handler code, so that a
// shutdown waits for it and reports it by name. Picking handlers is the framework's own
// microsecond-long decision; run through the executor it would show up as a pending call in
// drain reports, count against MaxConcurrent, and be refused once the drain begins, which would
// stop the framework from even deciding what to requeue.
package lifecycle
