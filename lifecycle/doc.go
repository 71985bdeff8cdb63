// Package lifecycle is kopf's handler model for controller-runtime: several named handlers
// per object, each run as a tracked call of a drain.Executor, their progress kept on the
// object (an annotation, or a field of its status), so that an operator stopped mid-way
// resumes where it was.
//
// Handlers builds the reconciler. Each Reconcile is one cycle:
//
//  1. Get the object (not found: nothing to do).
//  2. Read its Record from the annotation (HandlersOptions.Annotation), or from the status
//     (HandlersOptions.StatusField; see "Where the progress is kept"). A Record of another
//     metadata.generation is dropped: every handler runs again for a new generation. One
//     that cannot be decoded is logged, reported by a Warning Event (ReasonProgressCorrupt)
//     and dropped too, as is one the operator did not sign when HandlersOptions.ProgressKey
//     is set (ReasonProgressForged; see "Who can write the progress", and "Keeping the key"
//     for a key shared by every replica).
//  3. The handlers to run are those not done, in registration order, less those waiting out
//     a retry backoff (if all wait, the object is requeued when the first delay ends). A
//     Func, the lifecycle, picks among them.
//  4. The picked handlers are marked started by a merge patch with an optimistic lock. A
//     conflict means the object read was stale: nothing runs and the object is requeued,
//     so a handler never runs on progress older than the last recorded. Nothing runs
//     either if the patch fails (see "Progress that cannot be saved").
//  5. They run one after the other, in the Func's order, each as a tracked call named
//     "<controller>/<namespace>/<name>/<handler ID>" on its own copy of the object.
//  6. Their outcomes are recorded by a merge patch of the Record alone, with an
//     optimistic lock: on a conflict (a handler changed the object) it is made again on the
//     object read anew, if the Record is still what step 4 wrote; if someone else
//     (a new leader) recorded progress since, the outcomes are dropped and the handlers run
//     again rather than overwrite it (logged at V(1)). Success marks a
//     handler done; a reconcile.TerminalError marks it done and failed (Warning Event
//     ReasonHandlerFailed); another error, or a panic, counts a retry, keeps the error's
//     class (see "What Handlers publishes") and delays the next run by the backoff
//     (Warning Event ReasonHandlerError).
//  7. The object is requeued after NextCycle if handlers are ready to run, after the
//     shortest delay if all wait, and not at all once every handler is done.
//
// A handler stopped by a shutdown (it returned an error once the reconcile's context ended
// or the executor began to drain) is not a failure: no retry is counted and it stays
// started and not done, so the next manager runs it again. The outcomes of the handlers
// that finished are still recorded, by a patch on a context detached from the cancelled
// one and bounded by a few seconds, which the drain waits for; but not once the lease was
// lost (a runnable.Runnable's fence): that context ends with the fence, and a replica that
// lost the lease writes no more progress ("Leadership lost: not recording the outcomes of
// the handlers that ran", at Info); the next leader runs those handlers again.
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
// get one round of handlers for their whole life. Handler IDs are kept in the Record:
// renaming a handler runs it again. Handlers does not manage finalizers: it runs the
// handlers of an object being deleted like those of any other, while the object exists.
//
// # Where the progress is kept
//
// By default the Record is an annotation (HandlersOptions.Annotation): it works on every
// kind, but anyone who may update or patch the object writes it, with no status
// permission, and can fill the object's other annotations up to the API server's limit
// (256 KiB in all) so that the Record no longer fits: no handler runs then (reported, see
// below). HandlersOptions.StatusField keeps it in a string field of the status instead,
// written through the status subresource, for kinds that have one and a field for it (a
// CRD: a string property of .status in its schema, and in its Go type if typed). Whoever
// may patch <resource>/status writes it; Kubernetes' aggregated edit role grants no write of
// any status subresource (its bootstrap policy says so: status is the system's), unless a
// ClusterRole aggregated into it does, and kubebuilder's <kind>_editor_role, aggregated
// into it, grants only get on <kind>/status. With
// the status store, such editors cannot write the Record, nor keep it from being saved by
// filling annotations; they can still make the patches conflict (below), and grow the
// object (labels have no limit on their number) until etcd refuses every write: cap them
// (docs/security.md shows a ValidatingAdmissionPolicy). The annotation is
// then neither read nor written. Switching stores starts afresh: each object's handlers run
// once more for its current generation.
//
// # Progress that cannot be saved
//
// A Record that cannot be saved (the patch of step 4 or 6 refused: the object too large,
// invalid, forbidden, any other error; or ConflictsToReport cycles of the object in a row
// ended on a conflict, someone changing it faster than the operator reads and patches it)
// is reported by a Warning Event on the object (ReasonProgressNotSaved, its note saying why
// in words, never the error's text: an object too large for etcd, with its size; a kind
// without the status subresource StatusField needs, told from a deleted object by a live
// read, HandlersOptions.APIReader) and counted by the metric
// quiesce_progress_save_failures_total{controller, reason} (reason: too_large, invalid,
// forbidden, conflict or error), registered in controller-runtime's metrics.Registry; the
// reconcile returns the error, which controller-runtime logs ("Reconciler error", once per
// reconcile) and retries with its rate limiter's backoff (not for a missing status
// subresource: a terminal error). The Event recorder (client-go's tools/events) folds
// repeated Events into a series: their notes are the same for each failure of a reason (the
// count of conflicts is in the error alone). Fewer conflicts in a row
// are the optimistic lock at work: requeued quietly (V(1)).
//
// # Who can write the progress
//
// Whoever may write the store (above) writes the Record. Handlers therefore makes the
// operator choose, and fails at setup with an error wrapping ErrInvalidHandlers unless
// exactly one of these is set:
//
//   - HandlersOptions.ProgressKey: Records are signed, and forged ones refused (below);
//   - HandlersOptions.UnsignedProgress: Handlers trusts what it reads. A user who may write
//     the store can mark a handler done for its current (or next: in the same update as a
//     spec change) generation, so that it never runs, or write a corrupt value so that every
//     handler runs again. Choose it only if everyone who may write the store may also
//     decide which handlers run: with StatusField, if only the operator may patch the
//     status, that is the operator alone.
//
// With ProgressKey set, Handlers signs every Record it writes (HMAC-SHA256 of where it is
// kept, the annotation key or the status field, the controller, the object's UID, the
// generation and the handlers, with a key only the operator holds) and refuses any Record
// whose signature is missing or wrong, or that holds "generation", "handlers" or "mac"
// twice or spelt in another case (which encoding/json would also match): the refusal is
// logged ("Progress record is not signed by this operator"), reported by a Warning Event
// (ReasonProgressForged), and every handler runs for the current generation as if there
// were no Record. The handlers are decoded from the very bytes the signature covers. A user
// who may write the store then cannot:
//   - skip a handler: a Record marking it done for a generation must carry the operator's
//     signature for that object's UID, that place, that controller and that generation (so
//     the handler did finish once for them), so neither a made-up one, nor one edited, nor
//     one copied from another object (or an object of the same name deleted since), another
//     place or another controller, nor one of another generation, is accepted;
//   - set retry counts or delays the operator never wrote for that object and generation.
//
// and can:
//   - make handlers run again, with no ProgressForged Event: delete the Record (no Event at
//     all), or put back an older one the operator signed for the same object and
//     generation (accepted as valid: its handlers not done then run again, a handler that
//     failed for good runs again, and retry counts and delays go back to what they were,
//     so a failing handler is retried sooner);
//   - make them run again with an Event: corrupt the Record (ReasonProgressCorrupt) or forge
//     one (ReasonProgressForged);
//   - read the Record (progress, retry times, and what PublishErrors allows of errors);
//   - with the annotation store, keep it from being saved (see "Progress that cannot be
//     saved"), and with either store make the patches conflict.
//
// So a ProgressForged Event shows an attempt to skip a handler by a user without the key, and
// a key rotation; its absence shows nothing: making handlers run again needs no forgery.
// Handlers must be idempotent anyway. With StatusField and a status that only the operator
// may patch, editors can do none of the above but read the Record and make patches conflict.
//
// # Keeping the key
//
// Every replica of the operator that runs the handlers must hold the same key: a Record one
// signed is refused by another with a different key. Keep it in a Secret that only the
// operator's ServiceAccount may read, mounted as a file into the manager's pod, and read it
// at start (os.ReadFile: the bytes of the file are the key, a trailing newline included,
// the same for every replica). Create it with 32 random bytes or more:
//
//	kubectl -n <namespace> create secret generic quiesce-progress-key \
//	  --from-file=progress-key=<(head -c 32 /dev/urandom)
//
// Rotating the key: replace the Secret's value, then restart the operator's pods (the key
// is read at start). Records signed with the old key are then refused like forged ones: on
// the next reconcile of each object, a ProgressForged Warning Event is recorded, every
// handler runs once more for the current generation (so Handlers must be idempotent), and
// the Record is signed with the new key. Turning the key on, from UnsignedProgress, does
// the same to the unsigned Records. Turning it off keeps the signed Records' progress:
// UnsignedProgress ignores the signature.
//
// Upgrading from v0.2.0, whose signature bound neither the annotation nor the controller:
// its Records are not trusted. On the next reconcile of each object, "Progress record
// signed by an older release" is logged at Info (no Event), every handler runs once more for
// the current generation, and the Record is signed anew. A made-up signature of the old form
// is refused as forged.
//
// # What Handlers publishes
//
// The Record and the Events are read by everyone who may read the object or the Events of
// its namespace. By default a failed handler's error appears there as its class only (its
// API reason and HTTP status, or its Go type: see Progress.Message), never its text, which
// may hold URLs, response bodies or tokens; the whole error is in the operator's log.
// HandlersOptions.PublishErrors puts the text (its first KiB) in both. Text that others
// supply (handler ids in a Record, object names) is cut to 256 bytes before it reaches an
// error, a log line or an Event. docs/security.md lists everything quiesce publishes.
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
// Here: Handlers returns every misuse as an error wrapping ErrInvalidHandlers, never a
// panic; a Func that picks a handler not pending fails the reconcile with a terminal error.
//
// The Funcs never block and are safe for concurrent use (the random ones draw from
// math/rand/v2's goroutine-safe source). A reconciler of Handlers blocks while its
// handlers run, and is safe for concurrent use by a controller's workers.
package lifecycle
