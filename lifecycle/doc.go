// Package lifecycle is kopf's handler model for controller-runtime: several named handlers
// per object, each run as a tracked call of a drain.Executor, their progress kept in an
// annotation on the object, so that an operator stopped mid-way resumes where it was.
//
// Handlers builds the reconciler. Each Reconcile is one cycle:
//
//  1. Get the object (not found: nothing to do).
//  2. Read its Record from the annotation (HandlersOptions.Annotation). A Record of another
//     metadata.generation is dropped: every handler runs again for a new generation. One
//     that cannot be decoded is logged, reported by a Warning Event (ReasonProgressCorrupt)
//     and dropped too.
//  3. The handlers to run are those not done, in registration order, less those waiting out
//     a retry backoff (if all wait, the object is requeued when the first delay ends). A
//     Func, the lifecycle, picks among them.
//  4. The picked handlers are marked started by a merge patch with an optimistic lock. A
//     conflict means the object read was stale: nothing runs and the object is requeued,
//     so a handler never runs on progress older than the last recorded.
//  5. They run one after the other, in the Func's order, each as a tracked call named
//     "<controller>/<namespace>/<name>/<handler ID>" on its own copy of the object.
//  6. Their outcomes are recorded by a merge patch of the annotation alone: success marks a
//     handler done; a reconcile.TerminalError marks it done and failed (Warning Event
//     ReasonHandlerFailed); another error, or a panic, counts a retry, keeps the message
//     (its first KiB) and delays the next run by the backoff (Warning Event
//     ReasonHandlerError).
//  7. The object is requeued after NextCycle if handlers are ready to run, after the
//     shortest delay if all wait, and not at all once every handler is done.
//
// A handler stopped by a shutdown (it returned an error once the reconcile's context ended
// or the executor began to drain) is not a failure: no retry is counted and it stays
// started and not done, so the next manager runs it again. The outcomes of the handlers
// that finished are still recorded, by a patch on a context detached from the cancelled
// one and bounded by a few seconds, which the drain waits for.
//
// The lifecycles are kopf's, under kopf's names: AllAtOnce, OneByOne, Randomized, Shuffled
// and ASAP, the default; Named finds one by name, for a flag. A Func is called inline, on
// the reconcile's goroutine, never through the executor, as kopf never sends its
// lifecycles to its thread pool: picking handlers is the framework's own instant decision,
// and as a tracked call it would show in drain reports, take a MaxConcurrent slot and be
// refused once the drain begins. The lifecycles are pure: they read their arguments, never
// modify them, and return a new slice.
//
// Progress is per metadata.generation, which the API server bumps on changes of the spec,
// not of metadata or status: a handler that changes the spec starts a new generation, and
// every handler runs again. Objects without a generation (it stays 0, as for ConfigMaps)
// get one round of handlers for their whole life. Handler IDs are kept in the annotation:
// renaming a handler runs it again. Handlers does not manage finalizers: it runs the
// handlers of an object being deleted like those of any other, while the object exists.
//
// The Funcs never block and are safe for concurrent use (the random ones draw from
// math/rand/v2's goroutine-safe source). A reconciler of Handlers blocks while its
// handlers run, and is safe for concurrent use by a controller's workers.
package lifecycle
