package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quiesce-dev/quiesce/drain"
	"github.com/quiesce-dev/quiesce/internal"
	"github.com/quiesce-dev/quiesce/reconcilers"
)

// DefaultNextCycle is how soon an object with handlers left to run is reconciled again.
const DefaultNextCycle = 100 * time.Millisecond

// jitterRand returns the random number in [0, 1) that picks each jitter. Tests replace it.
var jitterRand = rand.Float64

// saveTimeout bounds the patches that record the outcomes of a cycle, which run on a context
// detached from the reconcile's (not from the fence): a handler that finished while the drain
// cancelled the reconcile still has its outcome recorded.
const saveTimeout = 10 * time.Second

// Reasons of the Events that Handlers records on the object (all of type Warning).
const (
	// ReasonProgressCorrupt is the reason of the Event for a progress annotation that could
	// not be decoded; all handlers start afresh.
	ReasonProgressCorrupt = "ProgressCorrupt"
	// ReasonHandlerError is the reason of the Event for a handler that failed and will be
	// retried after a backoff.
	ReasonHandlerError = "HandlerError"
	// ReasonHandlerFailed is the reason of the Event for a handler that returned a
	// reconcile.TerminalError; it is not retried for this generation of the object.
	ReasonHandlerFailed = "HandlerFailed"
	// ReasonProgressNotSaved is the reason of the Event for a Record that could not be saved:
	// the object is too large (its annotations at the API server's limit, or the whole
	// object at etcd's), the patch is invalid or forbidden (or the kind has no status
	// subresource for HandlersOptions.StatusField), or the object changed before each of ConflictsToReport cycles'
	// patches in a row. No handler runs until it is saved. The note says why.
	ReasonProgressNotSaved = "ProgressNotSaved"
)

// ConflictsToReport is how many cycles of an object in a row must end on an
// optimistic-lock conflict of the progress patch before Handlers reports the progress as
// not saved (ReasonProgressNotSaved, the metric, a reconcile error): fewer are the
// optimistic lock at work (a stale read), that many mean someone changes the object faster
// than the operator reads and patches it.
const ConflictsToReport = 5

// ErrInvalidHandlers is wrapped by the errors of Handlers for bad input.
var ErrInvalidHandlers = errors.New("invalid handlers")

// Handler is one named handler of a Handlers reconciler.
type Handler[T client.Object] struct {
	// ID names the handler in the Record, in the tracked call
	// "<controller>/<namespace>/<name>/<ID>", in logs and in Events. It must be non-empty
	// and unique among the handlers of one reconciler; keep it stable across releases, or
	// the handler runs again on objects whose Record knows it by its old ID.
	ID string

	// Fn does the handler's work on obj, a copy of the object owned by this call. It runs
	// as a tracked call of the executor, so it may block; it should honour ctx, which ends
	// when the drain cancels the call (drain.Options.CancelAfter). It returns nil on
	// success, a reconcile.TerminalError to fail for good (for this generation), or any
	// other error to be retried after a backoff. Fn may run more than once for a
	// generation (after a failure, a shutdown, a lost patch): make it idempotent.
	Fn func(ctx context.Context, obj T) error
}

// HandlersOptions configure Handlers. Every zero field means the documented default, but
// one of ProgressKey and UnsignedProgress must be set: who may write the progress is the
// operator's choice to make, not a default.
type HandlersOptions struct {
	// Lifecycle picks, on each reconcile, the handlers to run among those still to run.
	// nil: ASAP.
	Lifecycle Func

	// Recorder, if set, receives Warning Events on the object (ReasonProgressCorrupt,
	// ReasonProgressForged, ReasonProgressNotSaved, ReasonHandlerError,
	// ReasonHandlerFailed). nil: no Events, only log lines. See
	// reconcilers.WrapOptions.Recorder for where to get one.
	Recorder events.EventRecorder

	// Annotation is the key of the annotation holding the Record. "":
	// DefaultProgressAnnotation, unless StatusField is set. It must be a valid annotation key.
	Annotation string

	// StatusField, if set, keeps the Record in the object's status instead of an annotation:
	// in the string field .status.<StatusField> ("progress" is .status.progress; dots
	// separate nested fields: "quiesce.progress"), written by a merge patch of the status
	// subresource. The object's type needs that field (a string, in its Go type and in its
	// CRD's schema, which otherwise prunes it) and a status subresource, and the operator
	// needs patch on <resource>/status. Users who may patch the object but not its status
	// (Kubernetes' aggregated edit role grants no */status write) can then neither write
	// the Record nor fill the annotations so that it cannot be saved (see the package
	// documentation, "Where the progress is kept"). No annotation is read or written. "":
	// the annotation. Setting both StatusField and Annotation is an error.
	StatusField string

	// Backoff is the delay before the first retry of a failed handler; each further retry
	// doubles it, up to MaxBackoff. A random jitter shortens each delay by up to 10%, so
	// that objects that failed together do not all retry at once. 0 or negative:
	// reconcilers.DefaultBackoff; above 100 years: 100 years.
	Backoff time.Duration

	// MaxBackoff caps the retry delay; the jitter never lengthens a delay beyond it. A
	// stored retry time further than MaxBackoff away is not waited for. 0 or negative:
	// reconcilers.DefaultMaxBackoff; below Backoff: Backoff; above 100 years: 100 years.
	MaxBackoff time.Duration

	// NextCycle is the RequeueAfter of a reconcile that leaves handlers ready to run now,
	// and of one that found a stale object (an optimistic-lock conflict). The patch that
	// records a cycle usually triggers the next reconcile sooner. 0 or negative:
	// DefaultNextCycle.
	NextCycle time.Duration

	// Clock stamps Progress.Started and Progress.Delayed and decides when a delay is over.
	// nil: clock.RealClock{}.
	Clock clock.PassiveClock

	// Wrap is the Options of the reconcilers.Wrap that Handlers applies to its reconciler.
	// With Wrap.Recorder set, Wrap.Reader defaults to Handlers' client and Wrap.Object to an
	// object of newObj.
	Wrap reconcilers.WrapOptions

	// ProgressKey, if set, signs each Record that Handlers writes: an HMAC-SHA256 with this
	// key of where it is kept, the controller, the object's UID, the Record's generation and
	// its handlers. A Record without the signature, or with one that does not match, is
	// refused as forged: logged, reported by a Warning Event (ReasonProgressForged), and
	// every handler runs for the object's generation as if there were no Record. So a user
	// who may write the Record but does not hold the key can make handlers run again (by
	// deleting it or putting back an older one, without that Event), never skip one (see
	// the package documentation, "Who can write the progress"). Keep the key in a Secret that
	// only the operator reads, at least MinProgressKeyBytes (32) random bytes. Setting it,
	// or changing it, makes every Record written before refused once (with a
	// ReasonProgressForged Event): each object's handlers run once more, then the Record is
	// signed with the new key. Every replica that runs these handlers needs the same key
	// (see the package documentation, "Keeping the key"). nil: set UnsignedProgress
	// instead; Handlers requires one of the two.
	ProgressKey []byte

	// UnsignedProgress makes Handlers write Records without a signature and trust the
	// Record as it reads it: anyone who may patch the object (with StatusField, its status)
	// can then mark a handler done, so that it never runs for a generation, or make
	// handlers run again. Set it, instead of ProgressKey, only if everyone who may patch
	// these objects (their status) may also decide which handlers run. false, the
	// default: ProgressKey is required. Handlers returns an error unless exactly one of
	// ProgressKey and UnsignedProgress is set.
	UnsignedProgress bool

	// APIReader reads the object from the API server when the status patch gets a 404, to
	// tell an object deleted meanwhile (nothing to do) from a kind without a status
	// subresource (reported as not saved, reason invalid): give it mgr.GetAPIReader(). nil:
	// the client, whose cache may still hold an object deleted a moment before the patch, so
	// that it is reported once. Unused without StatusField.
	APIReader client.Reader

	// PublishErrors puts a failed handler's error text (its first KiB) in the Record's
	// Progress.Message and in the Events' notes, which anyone who may read the object or
	// its Events reads. false, the default: they carry the error's class only (its API
	// reason and HTTP status, or its Go type, see Progress.Message), and the whole text
	// is in the operator's log alone. Client errors often hold URLs, response bodies or
	// tokens: set it only if the object's readers may read those.
	PublishErrors bool
}

// checkProgressKey returns an error unless exactly one of ProgressKey and UnsignedProgress
// is set, and ProgressKey, if set, is long enough.
func (o *HandlersOptions) checkProgressKey() error {
	switch n := len(o.ProgressKey); {
	case o.ProgressKey == nil && !o.UnsignedProgress:
		return fmt.Errorf("failed to create handlers: no ProgressKey: set HandlersOptions.ProgressKey to at "+
			"least %d random bytes that only the operator holds, or UnsignedProgress to true if everyone "+
			"who may patch the objects may also decide which handlers run: %w", MinProgressKeyBytes, ErrInvalidHandlers)
	case o.ProgressKey != nil && o.UnsignedProgress:
		return fmt.Errorf("failed to create handlers: both ProgressKey and UnsignedProgress are set: "+
			"set one of them: %w", ErrInvalidHandlers)
	case o.ProgressKey != nil && n < MinProgressKeyBytes:
		return fmt.Errorf("failed to create handlers: ProgressKey has %d bytes, want at least %d: %w",
			n, MinProgressKeyBytes, ErrInvalidHandlers)
	}
	return nil
}

func (o *HandlersOptions) setDefaults() {
	if o.Lifecycle == nil {
		o.Lifecycle = ASAP
	}
	if o.Annotation == "" && o.StatusField == "" {
		o.Annotation = DefaultProgressAnnotation
	}
	if o.Backoff <= 0 {
		o.Backoff = reconcilers.DefaultBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = reconcilers.DefaultMaxBackoff
	}
	o.Backoff = min(o.Backoff, internal.BackoffCeiling)
	o.MaxBackoff = min(max(o.MaxBackoff, o.Backoff), internal.BackoffCeiling)
	if o.NextCycle <= 0 {
		o.NextCycle = DefaultNextCycle
	}
	if internal.IsNil(o.Clock) {
		o.Clock = clock.RealClock{}
	}
	if internal.IsNil(o.Recorder) {
		o.Recorder = nil // a typed nil: no Events, as documented for nil
	}
}

// liveReader returns APIReader, or c if it is nil.
func (o *HandlersOptions) liveReader(c client.Client) client.Reader {
	if internal.IsNil(o.APIReader) {
		return c
	}
	return o.APIReader
}

// Handlers returns a reconciler that runs handlers on each object of type T, kopf-style,
// and resumes after a shutdown where it stopped (see the package documentation for a
// cycle). It is a reconcilers.Wrap of ex with opts.Wrap: a drain waits for the reconciles
// and their handlers and names them, and while a runnable.Runnable drives ex, their
// contexts end by the drain, not by controller-runtime's shutdown.
//
// c reads and patches the objects. newObj makes an empty one; nil: a new value of T's
// element type (T must then be a pointer to a struct). Handler failures are not returned
// from Reconcile, so that controller-runtime's rate limiter does not override the backoff;
// failed reads and patches are, and a Func that picks a handler not pending is a terminal
// error.
//
// Handlers returns an error wrapping ErrInvalidHandlers for a nil ex (or one drain.New did
// not create) or c, an empty controller, no handlers, a handler with an empty or duplicate ID
// or a nil Fn, an invalid annotation key, both opts.Annotation and opts.StatusField, an empty
// field name in opts.StatusField, neither or both of opts.ProgressKey and
// opts.UnsignedProgress, a ProgressKey shorter than MinProgressKeyBytes, or a nil newObj with
// a T that is not a pointer to a struct; it never panics on misuse (see the package
// documentation, "Setup misuse").
func Handlers[T client.Object](
	ex *drain.Executor, c client.Client, controller string, newObj func() T, handlers []Handler[T], opts HandlersOptions,
) (reconcile.Reconciler, error) {
	if ex == nil || internal.CoreOf(ex) == nil {
		return nil, fmt.Errorf("failed to create handlers: nil executor, or not created by drain.New: %w", ErrInvalidHandlers)
	}
	if internal.IsNil(c) {
		return nil, fmt.Errorf("failed to create handlers: nil client: %w", ErrInvalidHandlers)
	}
	if controller == "" {
		return nil, fmt.Errorf("failed to create handlers: empty controller name: %w", ErrInvalidHandlers)
	}
	if len(handlers) == 0 {
		return nil, fmt.Errorf("failed to create handlers: no handlers: %w", ErrInvalidHandlers)
	}
	index := make(map[string]int, len(handlers))
	for i, h := range handlers {
		if h.ID == "" {
			return nil, fmt.Errorf("failed to create handlers: handler %d has an empty id: %w", i, ErrInvalidHandlers)
		}
		if _, dup := index[h.ID]; dup {
			return nil, fmt.Errorf("failed to create handlers: duplicate handler id %q: %w", h.ID, ErrInvalidHandlers)
		}
		if h.Fn == nil {
			return nil, fmt.Errorf("failed to create handlers: handler %q has a nil Fn: %w", h.ID, ErrInvalidHandlers)
		}
		index[h.ID] = i
	}
	if opts.StatusField != "" && opts.Annotation != "" {
		return nil, fmt.Errorf("failed to create handlers: both HandlersOptions.Annotation and StatusField are set: "+
			"set one of them: %w", ErrInvalidHandlers)
	}
	opts.setDefaults()
	st, err := newStore(opts.Annotation, opts.StatusField)
	if err != nil {
		return nil, err
	}
	if err := opts.checkProgressKey(); err != nil {
		return nil, err
	}
	if opts.ProgressKey != nil {
		opts.ProgressKey = append([]byte(nil), opts.ProgressKey...)
	}
	if newObj == nil {
		var zero T
		t := reflect.TypeOf(zero)
		if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
			return nil, fmt.Errorf("failed to create handlers: nil newObj and %v is not a pointer to a struct: %w",
				t, ErrInvalidHandlers)
		}
		newObj = func() T { return reflect.New(t.Elem()).Interface().(T) }
	}
	if !internal.IsNil(opts.Wrap.Recorder) { // the Reader and Object its Events need: c's and T's
		if internal.IsNil(opts.Wrap.Reader) {
			opts.Wrap.Reader = c
		}
		if internal.IsNil(opts.Wrap.Object) {
			opts.Wrap.Object = newObj()
			if internal.IsNil(opts.Wrap.Object) {
				return nil, fmt.Errorf("failed to create handlers: newObj returned nil: %w", ErrInvalidHandlers)
			}
		}
	}
	registerMetrics()
	r := &handlersReconciler[T]{
		store:      st,
		conflicts:  map[types.NamespacedName]int{},
		c:          c,
		ex:         ex,
		controller: controller,
		newObj:     newObj,
		handlers:   append([]Handler[T](nil), handlers...),
		index:      index,
		opts:       opts,
	}
	return reconcilers.Wrap(ex, controller, r, opts.Wrap), nil
}

type handlersReconciler[T client.Object] struct {
	store
	mu        sync.Mutex
	conflicts map[types.NamespacedName]int // the last cycles in a row whose progress patch conflicted, by object

	c          client.Client
	ex         *drain.Executor
	controller string
	newObj     func() T
	handlers   []Handler[T]
	index      map[string]int
	opts       HandlersOptions
}

// outcome is how one run of a handler ended.
type outcome int

const (
	ranOK          outcome = iota // succeeded
	ranFailed                     // failed with a retryable error
	ranTerminal                   // failed for good: a reconcile.TerminalError
	ranInterrupted                // stopped by a shutdown: not the handler's failure
)

// halt ends a cycle before its last step, with what Reconcile returns.
type halt struct {
	res      reconcile.Result
	err      error
	conflict bool // the progress patch conflicted
}

func (s halt) result() (reconcile.Result, error) { return s.res, s.err }

func (h *handlersReconciler[T]) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	stop := h.cycle(ctx, req)
	if !stop.conflict { // only the conflicts of cycles in a row count
		h.mu.Lock()
		delete(h.conflicts, req.NamespacedName)
		h.mu.Unlock()
	}
	return stop.result()
}

// cycle runs the steps of one cycle in order; each ends it early by a halt.
func (h *handlersReconciler[T]) cycle(ctx context.Context, req reconcile.Request) halt {
	obj, stop := h.load(ctx, req)
	if stop != nil {
		return *stop
	}
	prog := h.read(ctx, obj)
	picked, stop := h.selectHandlers(ctx, prog)
	if stop != nil {
		return *stop
	}
	obj, prog, stop = h.start(ctx, obj, prog, picked)
	if stop != nil {
		return *stop
	}
	next, ran := h.runPicked(ctx, obj, prog, picked)
	if ran {
		if stop := h.save(ctx, obj, next); stop != nil {
			return *stop
		}
	}
	return halt{res: h.requeue(ctx, next)}
}

// load gets the object. A missing object is not an error: it was deleted, and there is
// nothing left to run its handlers on.
func (h *handlersReconciler[T]) load(ctx context.Context, req reconcile.Request) (T, *halt) {
	obj := h.newObj()
	if internal.IsNil(obj) {
		return obj, &halt{err: reconcile.TerminalError(errors.New("failed to reconcile: newObj returned nil"))}
	}
	err := h.c.Get(ctx, req.NamespacedName, obj)
	switch {
	case err == nil:
		return obj, nil
	case apierrors.IsNotFound(err):
		return obj, &halt{}
	case h.stopping(ctx):
		return obj, h.stopped(ctx)
	default:
		return obj, &halt{err: fmt.Errorf("failed to get object: %w", err)}
	}
}

// selectHandlers asks the lifecycle which of the handlers ready to run should run now. It
// halts the cycle when nothing is to run now: every handler is done, every one left waits
// out a backoff, or the lifecycle picked none.
func (h *handlersReconciler[T]) selectHandlers(ctx context.Context, prog Record) ([]string, *halt) {
	logger := log.FromContext(ctx)
	todo, ready, soonest := h.todo(prog, h.opts.Clock.Now())
	switch {
	case len(todo) == 0:
		logger.V(1).Info("All handlers are done", "generation", prog.Generation)
		return nil, &halt{}
	case len(ready) == 0:
		logger.V(1).Info("All pending handlers wait out a backoff", "requeueAfter", soonest)
		return nil, &halt{res: reconcile.Result{RequeueAfter: soonest}}
	}
	picked, err := h.pick(ready, prog)
	if err != nil {
		return nil, &halt{err: reconcile.TerminalError(err)}
	}
	if len(picked) == 0 {
		logger.V(1).Info("The lifecycle picked no handler", "pending", ready)
		return nil, &halt{res: reconcile.Result{RequeueAfter: h.opts.NextCycle}}
	}
	return picked, nil
}

// start marks the picked handlers started, and returns the object as patched and the
// progress it now holds. The patch carries an optimistic lock because the object read may be
// stale (the cache lags behind the last patch): running handlers on it could run a handler
// already recorded as done, so a conflict runs nothing and reconciles the object again.
func (h *handlersReconciler[T]) start(ctx context.Context, obj T, prog Record, picked []string) (T, Record, *halt) {
	if h.stopping(ctx) {
		return obj, prog, h.stopped(ctx)
	}
	started := prog.clone()
	at := h.opts.Clock.Now().UTC()
	for _, id := range picked {
		hp := started.Handlers[id]
		hp.Started, hp.Delayed = &at, nil
		started.Handlers[id] = hp
	}
	patched, err := h.patch(ctx, obj, started, true)
	switch {
	case err == nil:
		return patched, started, nil
	case apierrors.IsConflict(err):
		return obj, prog, h.conflicted(ctx, obj, err)
	case apierrors.IsNotFound(err):
		return obj, prog, &halt{}
	case h.stopping(ctx):
		return obj, prog, h.stopped(ctx)
	default:
		return obj, prog, &halt{err: h.notSaved(obj, err, 0)}
	}
}

// conflicted ends a cycle whose progress patch conflicted: the object read was stale, or
// changed since; it is reconciled again after NextCycle. The ConflictsToReport-th cycle of
// the object in a row to end so, and each after it, reports the progress as not saved and
// fails the reconcile, so that the controller's rate limiter backs off. Reconcile forgets
// the count at the first cycle that ends otherwise.
func (h *handlersReconciler[T]) conflicted(ctx context.Context, obj T, err error) *halt {
	key := client.ObjectKeyFromObject(obj)
	h.mu.Lock()
	h.conflicts[key]++
	n := h.conflicts[key]
	h.mu.Unlock()
	if n >= ConflictsToReport {
		return &halt{err: h.notSaved(obj, err, n), conflict: true}
	}
	log.FromContext(ctx).V(1).Info("The object changed since it was read: reconciling it again",
		"requeueAfter", h.opts.NextCycle)
	return &halt{res: reconcile.Result{RequeueAfter: h.opts.NextCycle}, conflict: true}
}

// notSaved reports that obj's Record could not be saved, conflicts being the cycles in a row
// that conflicted: a Warning Event (ReasonProgressNotSaved) saying why, and the metric. It
// returns err, wrapped, for Reconcile to return: controller-runtime logs it, once.
func (h *handlersReconciler[T]) notSaved(obj T, err error, conflicts int) error {
	reason, why := h.whyNotSaved(obj, err)
	progressSaveFailures.WithLabelValues(h.controller, reason).Inc()
	h.event(obj, corev1.EventTypeWarning, ReasonProgressNotSaved,
		"Progress of the handlers not saved in %s, no handler runs until it is: %s", h.where, why)
	if reason == reasonConflict { // the count in the log only: a constant note folds into a series
		return fmt.Errorf("failed to save progress in %s (conflict, %d cycles in a row): %w", h.where, conflicts, err)
	}
	return fmt.Errorf("failed to save progress in %s (%s): %w", h.where, reason, err)
}

// runPicked runs the picked handlers one after the other, in the lifecycle's order, and
// returns prog with their outcomes, and whether it holds any outcome to save. It stops at
// the first handler a shutdown interrupted: the ones after it would be interrupted too. An
// interrupted handler keeps its progress (started, not done, no retry counted), so that the
// next manager runs it again.
func (h *handlersReconciler[T]) runPicked(ctx context.Context, obj T, prog Record, picked []string) (Record, bool) {
	next := prog.clone()
	ran := false
	for _, id := range picked {
		kind, err := h.run(ctx, id, obj)
		if kind == ranInterrupted {
			log.FromContext(ctx).Info("Handler interrupted by a shutdown: it runs again on the next start",
				"handler", id, "reason", err.Error())
			break
		}
		next.Handlers[id] = h.update(ctx, obj, id, next.Handlers[id], kind, err)
		ran = true
	}
	return next, ran
}

// update returns hp updated with the outcome of one run of handler id, logs the outcome,
// and reports a failure by a Warning Event on obj.
func (h *handlersReconciler[T]) update(
	ctx context.Context, obj T, id string, hp Progress, kind outcome, err error,
) Progress {
	logger := log.FromContext(ctx).WithValues("handler", id)
	switch kind {
	case ranOK:
		hp.Done, hp.Failed, hp.Delayed, hp.Message = true, false, nil, ""
		logger.V(1).Info("Handler succeeded")
	case ranTerminal:
		hp.Done, hp.Failed, hp.Delayed, hp.Message = true, true, nil, h.opts.published(err)
		logger.Error(err, "Handler failed for good: not retried for this generation")
		h.event(obj, corev1.EventTypeWarning, ReasonHandlerFailed, "Handler %s failed for good: %s", id, hp.Message)
	case ranFailed:
		if hp.Retries < math.MaxInt { // saturates: a stored count may be any int
			hp.Retries++
		}
		delay := h.backoff(hp.Retries)
		until := h.opts.Clock.Now().Add(delay).UTC()
		hp.Delayed, hp.Message = &until, h.opts.published(err)
		logger.Error(err, "Handler failed: retrying after a backoff", "retries", hp.Retries, "retryAfter", delay)
		h.event(obj, corev1.EventTypeWarning, ReasonHandlerError, "Handler %s failed, retry %d after %s: %s",
			id, hp.Retries, delay, hp.Message)
	}
	return hp
}

// save patches the progress with the outcomes of the handlers that ran, obj being the object
// as start patched it. It uses a context detached from the reconcile's, bounded by
// saveTimeout: a handler that finished while the drain cancelled the reconcile must still have
// its outcome saved, or it would run again for nothing. The drain waits for the patch, as it
// is part of the tracked reconcile. But it ends with the fence (the lease was lost: another
// replica may lead already), and the patch carries an optimistic lock: on a conflict it is
// made again on the object read anew only if the annotation still holds what start wrote.
// Otherwise someone else (a new leader) recorded progress since: this cycle's outcomes are
// dropped, and their handlers run again (they are idempotent), rather than overwrite it.
func (h *handlersReconciler[T]) save(ctx context.Context, obj T, next Record) *halt {
	logger := log.FromContext(ctx)
	fenced := internal.CoreOf(h.ex).Fenced()
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	defer context.AfterFunc(fenced, func() { cancel(context.Cause(fenced)) })()
	sctx, cancelTimeout := context.WithTimeout(sctx, saveTimeout)
	defer cancelTimeout()

	written, _, _ := h.stored(obj)
	cur := obj
	attempt := func() error {
		if fenced.Err() != nil {
			return context.Cause(fenced)
		}
		_, err := h.patch(sctx, cur, next, true)
		if !apierrors.IsConflict(err) {
			return err
		}
		fresh := h.newObj()
		if gerr := h.c.Get(sctx, client.ObjectKeyFromObject(obj), fresh); gerr != nil {
			return gerr
		}
		if now, _, _ := h.stored(fresh); now != written {
			return errProgressMoved
		}
		cur = fresh
		return err
	}
	// The last attempt's error, not OnError's: OnError answers nil for an error that wraps
	// a context's end (wait.Interrupted), the very error of a save the fence ended.
	var err error
	_ = retry.OnError(retry.DefaultBackoff, apierrors.IsConflict, func() error { err = attempt(); return err })
	switch {
	case err == nil:
		return nil
	case fenced.Err() != nil:
		logger.Info("Leadership lost: not recording the outcomes of the handlers that ran, the next leader runs them again",
			"reason", context.Cause(fenced).Error())
		return &halt{res: reconcile.Result{RequeueAfter: h.opts.NextCycle}}
	case errors.Is(err, errProgressMoved):
		logger.V(1).Info("The progress changed since the cycle started: its outcomes are left to the next cycle",
			"requeueAfter", h.opts.NextCycle)
		return &halt{res: reconcile.Result{RequeueAfter: h.opts.NextCycle}}
	case apierrors.IsConflict(err):
		return h.conflicted(ctx, obj, err)
	case apierrors.IsNotFound(err):
		return &halt{}
	default:
		return &halt{err: h.notSaved(obj, err, 0)}
	}
}

// errProgressMoved stops save's retries: the annotation no longer holds what the cycle's start
// wrote.
var errProgressMoved = errors.New("the progress changed since the cycle started")

// requeue says when to reconcile the object again after a cycle that ran handlers.
func (h *handlersReconciler[T]) requeue(ctx context.Context, next Record) reconcile.Result {
	if h.stopping(ctx) {
		// next does not tell interrupted handlers from ready ones; the next manager
		// reconciles the object anyway.
		return reconcile.Result{RequeueAfter: h.opts.NextCycle}
	}
	todo, ready, soonest := h.todo(next, h.opts.Clock.Now())
	switch {
	case len(todo) == 0:
		log.FromContext(ctx).V(1).Info("All handlers are done", "generation", next.Generation)
		return reconcile.Result{}
	case len(ready) > 0:
		return reconcile.Result{RequeueAfter: h.opts.NextCycle}
	default:
		return reconcile.Result{RequeueAfter: soonest}
	}
}

// read returns the object's progress for its current generation: fresh if there is none,
// if it is of another generation, or if it cannot be decoded (then logged and an Event).
func (h *handlersReconciler[T]) read(ctx context.Context, obj T) Record {
	gen := obj.GetGeneration()
	fresh := Record{Generation: gen, Handlers: map[string]Progress{}}
	raw, ok, err := h.stored(obj)
	if !ok {
		return fresh
	}
	var p Record
	if err == nil {
		p, err = ParseRecord(raw)
	}
	if err != nil {
		log.FromContext(ctx).Error(err, "Progress record is corrupt: all handlers start afresh", "progressIn", h.where)
		h.event(obj, corev1.EventTypeWarning, ReasonProgressCorrupt,
			"%s holds no valid progress, all handlers start afresh: %s", h.whereTitle(), err.Error())
		return fresh
	}
	// Checked before the generation: a forged Record of another generation is harmless,
	// but the attempt shows.
	if h.opts.ProgressKey != nil {
		p, err = openSigned(raw, h.opts.ProgressKey, h.binding(obj))
		switch {
		case errors.Is(err, errOldSignature):
			log.FromContext(ctx).Info("Progress record signed by an older release: all handlers run once more",
				"progressIn", h.where, "generation", gen)
			return fresh
		case err != nil:
			log.FromContext(ctx).Error(err, "Progress record is not signed by this operator: all handlers start afresh",
				"progressIn", h.where, "generation", gen)
			h.event(obj, corev1.EventTypeWarning, ReasonProgressForged,
				"%s holds progress this operator did not sign, all handlers start afresh: %s", h.whereTitle(), err.Error())
			return fresh
		}
	}
	if p.Generation != gen {
		log.FromContext(ctx).V(1).Info("New generation: all handlers run again",
			"generation", gen, "progressGeneration", p.Generation)
		return fresh
	}
	if p.Handlers == nil {
		p.Handlers = map[string]Progress{}
	}
	return p
}

// todo returns the ids of the handlers not done, in registration order; those of them not
// waiting out a backoff at now; and, if all wait, how long until the first may run.
func (h *handlersReconciler[T]) todo(p Record, now time.Time) (todo, ready []string, soonest time.Duration) {
	for _, hd := range h.handlers {
		hp := p.Handlers[hd.ID]
		if hp.Done {
			continue
		}
		todo = append(todo, hd.ID)
		// A delay is at most MaxBackoff: a stored time further away (an edited annotation,
		// a clock that jumped) is not waited for, lest it park the handler for centuries.
		if d := waitFor(hp.Delayed, now); d > 0 && d <= h.opts.MaxBackoff {
			if soonest == 0 || d < soonest {
				soonest = d
			}
			continue
		}
		ready = append(ready, hd.ID)
	}
	return todo, ready, soonest
}

// waitFor returns how long from now until delayed, 0 for none.
func waitFor(delayed *time.Time, now time.Time) time.Duration {
	if delayed == nil {
		return 0
	}
	return delayed.Sub(now)
}

// pick calls the lifecycle inline and checks that it picked only ready handlers, once each.
func (h *handlersReconciler[T]) pick(ready []string, p Record) ([]string, error) {
	picked := h.opts.Lifecycle(append([]string(nil), ready...), p.progressOf(ready))
	ok := make(map[string]bool, len(ready))
	for _, id := range ready {
		ok[id] = true
	}
	for _, id := range picked {
		if !ok[id] {
			return nil, fmt.Errorf("failed to pick handlers: the lifecycle picked %q, "+
				"which is not pending or picked twice (pending: %q)", id, ready)
		}
		ok[id] = false
	}
	return picked, nil
}

// run runs handler id on a copy of obj as a tracked call and classifies its outcome.
func (h *handlersReconciler[T]) run(ctx context.Context, id string, obj T) (outcome, error) {
	own, ok := obj.DeepCopyObject().(T)
	if !ok {
		return ranTerminal, reconcile.TerminalError(
			fmt.Errorf("failed to copy the object: DeepCopyObject of %T is not a %T", obj, own))
	}
	fn := h.handlers[h.index[id]].Fn
	err := callHandler(ctx, id, func(ctx context.Context) error { return fn(ctx, own) })
	switch {
	case err == nil:
		return ranOK, nil
	case errors.Is(err, reconcile.TerminalError(nil)):
		return ranTerminal, err
	case errors.Is(err, drain.ErrDraining), ctx.Err() != nil,
		h.draining() && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return ranInterrupted, err
	default:
		return ranFailed, err
	}
}

// stopping reports whether the reconcile is being stopped: its context ended (the drain
// cancelled it, or controller-runtime did for an executor no Runnable drives) or the executor
// drains.
func (h *handlersReconciler[T]) stopping(ctx context.Context) bool {
	return ctx.Err() != nil || h.draining()
}

// stopped ends a reconcile that a shutdown stopped before it ran a handler: nothing was
// started, so there is nothing to record and nothing to report as an error; the next
// manager reconciles the object again.
func (h *handlersReconciler[T]) stopped(ctx context.Context) *halt {
	log.FromContext(ctx).V(1).Info("Shutting down: leaving the handlers to the next start")
	return &halt{res: reconcile.Result{RequeueAfter: h.opts.NextCycle}}
}

// binding is where obj's Record is signed for: its place (annotation or status field), this
// controller, obj's UID.
func (h *handlersReconciler[T]) binding(obj T) binding {
	return binding{annotation: h.bound, controller: h.controller, uid: obj.GetUID()}
}

func (h *handlersReconciler[T]) draining() bool {
	select {
	case <-h.ex.Draining():
		return true
	default:
		return false
	}
}

// patch writes p into the store of a copy of obj with a merge patch that sends only the
// annotation, or only the status field (of the status subresource), with the resourceVersion
// if lock, and returns the object as the API server returned it.
func (h *handlersReconciler[T]) patch(ctx context.Context, obj T, p Record, lock bool) (T, error) {
	var zero T
	val, err := p.Encode()
	if h.opts.ProgressKey != nil {
		val, err = encodeSigned(p, h.opts.ProgressKey, h.binding(obj))
	}
	if err != nil {
		return zero, err
	}
	mod, ok := obj.DeepCopyObject().(T)
	if !ok {
		return zero, reconcile.TerminalError(
			fmt.Errorf("failed to copy the object: DeepCopyObject of %T is not a %T", obj, mod))
	}
	if h.field != nil {
		rv := ""
		if lock {
			rv = obj.GetResourceVersion()
		}
		data, err := h.statusPatch(val, rv)
		if err != nil {
			return zero, err
		}
		if err := h.c.Status().Patch(ctx, mod, client.RawPatch(types.MergePatchType, data)); err != nil {
			if apierrors.IsNotFound(err) {
				return zero, h.notFound(ctx, obj, err)
			}
			return zero, fmt.Errorf("failed to patch progress: %w", err)
		}
		// Else every cycle would run every handler again, for ever, with no error.
		if got, _, _ := h.stored(mod); got != val {
			return zero, reconcile.TerminalError(fmt.Errorf("failed to patch progress: %w", errFieldDropped))
		}
		return mod, nil
	}
	ann := mod.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[h.annotation] = val
	mod.SetAnnotations(ann)
	from := client.MergeFrom(obj)
	if lock {
		from = client.MergeFromWithOptions(obj, client.MergeFromWithOptimisticLock{})
	}
	if err := h.c.Patch(ctx, mod, from); err != nil {
		return zero, fmt.Errorf("failed to patch progress: %w", err)
	}
	return mod, nil
}

// notFound returns the error of a status patch of obj that got err, a 404: err itself if
// the object is gone (a live read does not find it either), a terminal error if the object
// is there, for then its kind has no status subresource: every patch would get a 404.
func (h *handlersReconciler[T]) notFound(ctx context.Context, obj T, err error) error {
	live := h.newObj()
	switch gerr := h.opts.liveReader(h.c).Get(ctx, client.ObjectKeyFromObject(obj), live); {
	case apierrors.IsNotFound(gerr):
		return fmt.Errorf("failed to patch progress: %w", err)
	case gerr != nil:
		return fmt.Errorf("failed to read the object after its status patch got a 404: %w", gerr)
	}
	kind := fmt.Sprintf("%T", obj)
	if gvk, gerr := apiutil.GVKForObject(obj, h.c.Scheme()); gerr == nil {
		kind = gvk.GroupKind().String()
	}
	return reconcile.TerminalError(fmt.Errorf("failed to patch progress: %w", &noStatusError{kind: kind}))
}

// backoff returns the delay before the next run of a handler that failed retries times:
// Backoff doubled at each retry after the first, capped at MaxBackoff, less the jitter. The
// jitter shortens the delay rather than lengthens it, so that MaxBackoff stays a cap.
func (h *handlersReconciler[T]) backoff(retries int) time.Duration {
	// 63 doublings take any delay from 1ns past the ceiling: a handler's retries (not
	// bounded) need no more steps than that.
	const steps = 64
	b := wait.Backoff{Duration: h.opts.Backoff, Factor: 2, Steps: steps, Cap: h.opts.MaxBackoff}
	var d time.Duration
	for range min(max(retries, 1), steps) {
		d = b.Step()
	}
	return internal.Jitter(d, jitterRand())
}

// event records an Event on obj, its note cut to the 1 KiB the API server accepts.
func (h *handlersReconciler[T]) event(obj T, typ, reason, note string, args ...any) {
	if h.opts.Recorder == nil {
		return
	}
	h.opts.Recorder.Eventf(obj, nil, typ, reason, "Reconcile", "%s", internal.TruncateMessage(fmt.Sprintf(note, args...)))
}

// callHandler runs fn as reconcilers.Call does, nested in the wrapped reconcile's call, but
// returns a panic in fn as its *drain.PanicError (with fn's stack) instead of raising it: a
// handler's panic is a failure to retry, not a crash of the reconcile.
func callHandler(ctx context.Context, id string, fn func(context.Context) error) error {
	c, ok := internal.CallOf(ctx)
	if !ok { // not reached: Handlers wraps its reconciler
		return reconcilers.Call(ctx, id, fn)
	}
	return c.Core().Call(ctx, internal.Nested(c, id), fn)
}
