package internal

import (
	"context"
	"time"
)

// Settings are the settings of one executor that only quiesce's own packages change. They
// are set right after drain.New, before the executor is shared, and only read after that.
type Settings struct {
	// Driven: a runnable.Runnable drains the executor when its manager stops. The contexts
	// of calls started with CallOptions.Shield then ignore their caller's cancellation
	// (not its deadline) and end by the drain (drain.Options.CancelAfter) instead.
	Driven bool

	// AfterCall, if set, is called on the call's goroutine right after fn returned, with
	// the call's controller (CallOptions.Controller, "" for calls that have none), how long
	// fn ran and its error (the *drain.PanicError if fn panicked). It must not block.
	// A panic in it is logged, never raised.
	AfterCall func(controller string, took time.Duration, err error)
}

// CallOptions shape one tracked call started through Run or Call.
type CallOptions struct {
	// Name is the call's name: its non-empty parts joined by "/". It is joined only when
	// a report, Pending or an error needs it, so that a reconcile's name costs nothing.
	Name [4]string

	// Controller is the controller given to reconcilers.Wrap that the call belongs to,
	// for the metrics; "" for any other call.
	Controller string

	// Shield: if the executor is Driven, fn's context ignores ctx's cancellation (it keeps
	// ctx's deadline and values) and ends when the drain cancels the call.
	Shield bool

	// Repanic (Run only): a panic in fn is raised again on the caller's goroutine, with
	// its original stack, once the executor settled and counted the call.
	Repanic bool
}

// Hooks installed by drain's init.
var (
	// SettingsOf returns the settings of ex, a *drain.Executor.
	SettingsOf func(ex any) *Settings

	// Run is drain.Executor.Run on ex (a *drain.Executor), shaped by o.
	Run func(ex any, ctx context.Context, o CallOptions, fn func(context.Context) error) error

	// Call is drain.Executor.Call on ex (a *drain.Executor), shaped by o (Repanic aside).
	Call func(ex any, ctx context.Context, o CallOptions, fn func(context.Context) error) error

	// CallOf returns the innermost tracked call whose fn's context ctx is (or derives
	// from): its executor, and its options with the whole name in Name[0].
	CallOf func(ctx context.Context) (ex any, o CallOptions, ok bool)
)

// Age rounds d for reading, as reports, errors and /debug/quiesce show a call's age: whole
// seconds from 1s on, milliseconds below.
func Age(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}
