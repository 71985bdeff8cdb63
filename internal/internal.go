package internal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrCancelAtStop is the cause (context.Cause) of the context of a call cancelled as the
// drain began because its controller's stop policy is reconcilers.CancelAtStop.
var ErrCancelAtStop = errors.New(
	"cancelled as the drain began: the controller's stop policy is reconcilers.CancelAtStop")

// Captures counts the captures of every goroutine's stack that drain took to locate calls,
// in this process: what tests and benchmarks of /debug/quiesce measure.
var Captures atomic.Uint64

// Settings are the settings of one executor that only quiesce's own packages set, before
// the executor is shared (runnable.New, reconcilers.Wrap); they are only read after that.
type Settings struct {
	// Owned: a runnable.Runnable created the executor and drains it when its manager
	// stops. The contexts of calls with CallOptions.Shield ignore their caller's
	// cancellation (not its deadline) and end by the drain (drain.Options.CancelAfter).
	Owned bool

	// Grace is the owner's grace period (runnable.Options.GracePeriod), from the drain's
	// start to the abandon; 0 when there is no owner. The drain cancels a call with a
	// cleanup window (Cleanups) at Grace - window if that comes before CancelAfter;
	// reconcilers.Wrap refuses a window that cannot fit.
	Grace time.Duration

	// Cleanups maps a controller (CallOptions.Controller) to its cleanup window
	// (reconcilers.WrapOptions.Cleanup), string to time.Duration: the drain cancels its
	// calls, nested ones included, early enough to keep this long before the abandon, at
	// min(CancelAfter, Grace - window); without an owner the time left until the first
	// Drain's ctx deadline stands for Grace. Kept per controller, not in CallOptions: a
	// call's record stays within its allocation size class (drain's TestCallRecordSize).
	Cleanups sync.Map

	// AfterCall, if set, is called on the call's goroutine right after fn returned, with
	// the call's controller (CallOptions.Controller, "" for calls that have none), how long
	// fn ran and its error (the *drain.PanicError if fn panicked). It must not block.
	// A panic in it is logged, never raised.
	AfterCall func(controller string, took time.Duration, err error)

	// StopKV, if set, returns key/values that each drain report line starts with
	// (runnable.Runnable: sinceStop, the time since the stop began).
	StopKV func() []any

	// Observers are told of slow and abandoned calls (reconcilers.WrapOptions.Recorder adds one).
	Observers Observers

	// DrainOver, if set, returns a channel closed when the owner's drain is over
	// (runnable.Runnable.Done), once the owner began that drain; nil before, so that a drain
	// the owner did not begin (Drain called on the executor of a Runnable never started) is
	// not waited for: nothing would close the channel. A wrapped reconcile that the drain
	// refused waits for it, or for the end of its own context (its controller stops),
	// before it asks to be requeued: a refused request comes back once per stop, not every
	// RequeueAfter.
	DrainOver func() <-chan struct{}

	// Claims, if set, are the per-object claims of the owner (runnable.Setup with the
	// manager's leader election and a lease namespace) that reconcilers.HandOffAtStop needs;
	// nil otherwise, and reconcilers.Wrap refuses the policy.
	Claims Claims
}

// Claims are the per-object claims of one replica (internal/claims.Registry), as
// reconcilers.Wrap uses them for HandOffAtStop controllers. Safe for concurrent use.
type Claims interface {
	// Wait reads the object's claim live (no cache) and returns how long another replica
	// still holds it, by this replica's own observation (Left 0 when none does).
	Wait(ctx context.Context, controller, namespace, name string) (ClaimWait, error)
	// Begin registers a reconcile of the object as in flight, before it is admitted: the
	// stop claims what is in flight. End it when the reconcile returned.
	Begin(controller, namespace, name, reconcileID string) Claimed
}

// ClaimWait is what Claims.Wait found of an object's claim.
type ClaimWait struct {
	// Left is how long another replica still holds the claim; 0 when none does.
	Left time.Duration
	// Holder is the replica that holds it, when Left > 0.
	Holder string
	// First is true the first time this replica finds Holder holding the claim: the
	// requeues of one wait report it once.
	First bool
}

// Claimed is one reconcile in flight of a HandOffAtStop controller (Claims.Begin).
type Claimed interface {
	// Bind returns ctx, ended with a cause naming the claim when the claim taken for the
	// reconcile is not renewed within its deadline; call cancel when the reconcile returned.
	// onFence, if not nil, is called once when that happens (before End returns, never
	// under a lock); it must not call End.
	Bind(ctx context.Context, onFence func()) (bound context.Context, cancel context.CancelFunc)
	// End marks the reconcile returned and releases its claim, if taken. Idempotent.
	End()
}

// CleanupOf returns the cleanup window of controller (Cleanups); 0: none.
func (s *Settings) CleanupOf(controller string) time.Duration {
	if controller == "" {
		return 0
	}
	d, _ := s.Cleanups.Load(controller)
	w, _ := d.(time.Duration)
	return w
}

// CallOptions shape one tracked call started through Run, Call or Go.
type CallOptions struct {
	// Name is the call's name.
	Name string

	// Controller is the controller given to reconcilers.Wrap that the call belongs to,
	// for the metrics; "" for any other call.
	Controller string

	// ReconcileID is controller-runtime's reconcileID of the wrapped reconcile the call
	// is, or runs inside; "" for any other call. Reports show it.
	ReconcileID string

	// Tag is the caller's own mark of the call, passed to Observers (reconcilers sets the
	// reconcile's request, and Call inherits it); nil for calls that have none.
	Tag any

	// Shield: if the executor is Owned, fn's context ignores ctx's cancellation (it keeps
	// ctx's deadline and values) and ends when the drain cancels the call.
	Shield bool

	// Repanic: a panic in fn is raised again on the caller's goroutine, with the value fn
	// panicked with, once the executor settled and counted the call (Run raises it from fn's
	// own frames; Call from the caller's). Go ignores it.
	Repanic bool

	// Daemon: the call is meant to run until the drain stops it (a per-object daemon).
	// It is listed with drain.Pending.Daemon set, never counted or logged as slow, and its
	// context is cancelled the moment the drain begins, not at CancelAfter. It never waits
	// for nor holds a MaxConcurrent slot.
	Daemon bool

	// CancelAtStop: the drain cancels the call's context as it begins, with the cause
	// ErrCancelAtStop, instead of at CancelAfter (reconcilers.CancelAtStop; nested calls
	// inherit it).
	CancelAtStop bool

	// NoSlot: the call never waits for nor holds a MaxConcurrent slot (webhook calls:
	// MaxConcurrent bounds reconciles and their calls only).
	NoSlot bool

	// Namespace and Object, when Object is set, end the call's name (a reconcile's, named
	// after its request): see FullName. The name is put together when something reads it,
	// not for every call.
	Namespace, Object string
}

// FullName returns the call's name: Name, then "/<Namespace>/<Object>" when Object is set
// ("/<Object>" when Namespace is empty).
func (o *CallOptions) FullName() string {
	switch {
	case o.Object == "":
		return o.Name
	case o.Namespace == "":
		return o.Name + "/" + o.Object
	default:
		return o.Name + "/" + o.Namespace + "/" + o.Object
	}
}

// Core is what quiesce's packages use of a *drain.Executor beyond its public methods.
// drain implements it; Of returns it.
type Core interface {
	// Settings returns the executor's settings, to be changed before it is shared.
	Settings() *Settings
	// Run is drain.Executor.Run shaped by o.
	Run(ctx context.Context, o CallOptions, fn func(context.Context) error) error
	// Call is drain.Executor.Call shaped by o.
	Call(ctx context.Context, o CallOptions, fn func(context.Context) error) error
	// RunHandler is Run with h.Handle as fn: a wrapped reconcile's request and result
	// travel in h, so no closure is made per reconcile.
	RunHandler(ctx context.Context, o CallOptions, h Handler) error
	// Go is drain.Executor.Go shaped by o: it returns nil once fn is tracked, or the
	// error of a refused call (errors.Is(err, drain.ErrDraining) once the drain began).
	Go(ctx context.Context, o CallOptions, fn func(context.Context) error) error
	// Abandoned tells the Observers of every call still running, located. runnable calls
	// it once, at the end of the grace period; it returns when they did.
	Abandoned(ctx context.Context)
	// Now is the time on the executor's clock (drain.Options.Clock).
	Now() time.Time
	// Entries lists the oldest limit pending calls (all with limit < 0), located, as
	// reports show them, and how many are pending.
	Entries(limit int) (ents Entries, total int)
	// Listing is Entries for /debug/quiesce: it copies the oldest limit calls (all with
	// limit < 0) under the executor's lock and renders them outside it, locating them with
	// any capture of the stacks taken in the last second, shared with every other asker;
	// calls that began after that capture are listed without a location (Where and Handler
	// empty). At most one capture a second, however many ask and however many calls begin.
	Listing(limit int) (ents Entries, total int)
	// Fence ends the context of every call still running at once, with cause, and returns
	// how many it ended. runnable calls it when the lease is lost, once the drain began.
	Fence(cause error) int
	// Fenced is a context that Fence ends, with its cause; it never ends otherwise. Work
	// that outlives a call's cancellation on purpose (lifecycle's save of a cycle's
	// outcomes) ends with it: once the lease is lost, this replica writes nothing more.
	Fenced() context.Context
}

// Handler is a tracked call's function as a value that carries its own input and output
// (see Core.RunHandler).
type Handler interface {
	Handle(ctx context.Context) error
}

// NotCreated is the panic of the methods without an error result of a drain.Executor that
// drain.New did not create (a zero or nil one), and of Of given one; the text of the error
// of the others.
const NotCreated = "drain: Executor not created by drain.New (use drain.New(drain.Options{}))"

// CoreOf returns the Core of ex, a *drain.Executor, or nil if drain.New did not create it.
// Package drain sets it when initialised: it imports this package, not the reverse.
var CoreOf func(ex any) Core

// Of returns the Core of ex, a *drain.Executor. It panics with NotCreated if drain.New did
// not create ex: reconcilers.Wrap and the others that call it at setup fail there, not at
// their first call.
func Of(ex any) Core {
	c := CoreOf(ex)
	if c == nil {
		panic(NotCreated)
	}
	return c
}

// CallKey is the context key under which fn's context (and every context derived from
// it) returns its Call.
type CallKey struct{}

// Call is a tracked call as its fn's context tells it: see CallOf.
type Call interface {
	// Core returns the Core of the call's executor.
	Core() Core
	// Options returns the options the call was started with (its name in parts), with the
	// name Rename gave it.
	Options() CallOptions
	// Rename names the call name from now on (Options: Name name, no Namespace nor Object):
	// reports, Pending and /debug/quiesce show it. It takes the executor's lock, as they do;
	// fn's goroutine reads the name without it, so Rename is called there, before fn shares
	// its context (runnable names an admission call from the request once decoded).
	Rename(name string)
}

// CallOf returns the innermost tracked call whose fn's context ctx is, or derives from.
func CallOf(ctx context.Context) (Call, bool) {
	if ctx == nil {
		return nil, false
	}
	c, ok := ctx.Value(CallKey{}).(Call)
	return c, ok
}

// Age rounds d for reading, as reports, errors and /debug/quiesce show a call's age: whole
// seconds from 1s on, milliseconds below.
func Age(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// MaxListed bounds how many calls a report, a log line or an error lists; the rest are
// counted.
const MaxListed = 20

// MaxNameBytes bounds the bytes of a name that a log line, a report entry, an error or
// /debug/quiesce shows; Cut marks a longer one.
const MaxNameBytes = 256

// Cut returns s, or, when s is longer than MaxNameBytes, its first MaxNameBytes bytes
// (never splitting a UTF-8 sequence) followed by "...(N bytes)", N being len(s).
//
// It is the one helper through which text that others supply (call names made of object
// names, admission requests' names and generateNames, handler ids read from an annotation,
// panic values) passes before a log line, an Event, an annotation or an error carries it:
// whatever they send, what quiesce writes of it is bounded.
func Cut(s string) string {
	if len(s) <= MaxNameBytes {
		return s
	}
	n := MaxNameBytes
	for n > 0 && !startsRune(s[n]) {
		n--
	}
	return s[:n] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// Nested returns the options of a call named name nested in c: named "<c's name>/<name>",
// of c's controller, reconcile and tag (reconcilers.Call and lifecycle's handlers).
// The name stays in parts (one concatenation, not two: FullName puts it together).
func Nested(c Call, name string) CallOptions {
	outer := c.Options()
	o := CallOptions{
		Name: outer.Name, Namespace: outer.Namespace, Object: outer.Object,
		Controller: outer.Controller, ReconcileID: outer.ReconcileID, Tag: outer.Tag, CancelAtStop: outer.CancelAtStop,
	}
	if o.Object != "" {
		o.Object += "/" + name
	} else {
		o.Name += "/" + name
	}
	return o
}

// CutError returns err with its text cut as Cut cuts a name, for an error whose text
// quotes what others supply (encoding/json's and time's errors quote the values they
// refuse): errors.Is and errors.As still see err. A short err is returned as it is.
func CutError(err error) error {
	if err == nil || len(err.Error()) <= MaxNameBytes {
		return err
	}
	return cutError{err}
}

type cutError struct{ err error }

func (e cutError) Error() string { return Cut(e.err.Error()) }
func (e cutError) Unwrap() error { return e.err }

// startsRune reports whether b can begin a UTF-8 sequence (it is no continuation byte).
func startsRune(b byte) bool { return b&0xC0 != 0x80 }

// Entry is one pending call as a report line, the abandoned line and /debug/quiesce show
// it. Name, Where and Handler are cut to MaxNameBytes.
type Entry struct {
	Name        string `json:"name"`
	Age         string `json:"age"`
	Detached    bool   `json:"detached"`
	Daemon      bool   `json:"daemon,omitempty"`
	ReconcileID string `json:"reconcileID,omitempty"`
	Where       string `json:"where,omitempty"`
	Handler     string `json:"handler,omitempty"`
	// Cleanup is the call's cleanup window (Settings.Cleanups) once the drain cancelled
	// it: the call is in its cleanup. "" for the others.
	Cleanup string `json:"cleanup,omitempty"`
	// CleanupUnfinished marks, in the abandoned line, a call cancelled for its cleanup
	// window and still running at the end of the grace period: its cleanup did not finish.
	CleanupUnfinished bool `json:"cleanupUnfinished,omitempty"`
}

// Entries are the calls a log line lists (its "calls" value). They print as a JSON array of
// Entry, keys and all, under every common logr sink: zapr, funcr, klog (klogr, textlogger),
// logr.FromSlogHandler with slog's text and JSON handlers, and bombsimon/logrusr with logrus'
// text and JSON formatters (docs/operating.md, "Loggers").
type Entries []Entry

// MarshalLog implements logr.Marshaler, which zapr, funcr, klog and logrusr honour.
func (e Entries) MarshalLog() any { return entriesJSON(e) }

// LogValue implements slog.LogValuer: slog's JSON handler writes the array, its text
// handler the array's JSON text.
func (e Entries) LogValue() slog.Value { return slog.AnyValue(entriesJSON(e)) }

// entriesJSON is what Entries log as. Each sink renders it through the one interface it
// honours: json.Marshaler (zap's and logrus' JSON, klog), encoding.TextMarshaler (slog's
// text), fmt.Formatter (logrus' text, which prints values with fmt.Sprint) and reflection over
// the json tags (funcr). It is no fmt.Stringer: zap and funcr would then log a string.
type entriesJSON []Entry

func (e entriesJSON) MarshalJSON() ([]byte, error) { return json.Marshal([]Entry(e)) }
func (e entriesJSON) MarshalText() ([]byte, error) { return e.MarshalJSON() }

// Format implements fmt.Formatter: the JSON text, whatever the verb.
func (e entriesJSON) Format(f fmt.State, _ rune) {
	b, _ := e.MarshalJSON() // strings and bools: it cannot fail
	_, _ = f.Write(b)
}

// Closed reports whether ch is closed (or ready): the state a done channel tells.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// More returns kv with "more": how many of total calls a line leaves out, listing listed;
// kv alone when it lists them all.
func More(kv []any, total, listed int) []any {
	if more := total - listed; more > 0 {
		return append(kv, "more", more)
	}
	return kv
}

// Safely runs log, a call of a Logger, containing a panic in it: on quiesce's own
// goroutines a broken Logger must not crash the process nor stop the drain.
func Safely(log func()) {
	defer func() { _ = recover() }()
	log()
}

// The defaults of drain.Options' ReportEvery and SlowAfter, which runnable's flags show.
const (
	DefaultReportEvery = 5 * time.Second
	DefaultSlowAfter   = time.Minute
)
