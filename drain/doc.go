// Package drain is a tracked executor: it runs named calls on tracked goroutines, refuses new
// calls once it drains, and waits for every call it admitted to really end, logging at an
// interval which calls it still waits for and where they are blocked.
//
// An Executor runs each fn given to Call or Go on a goroutine of its own and tracks it until
// fn returns, even when the caller stopped waiting. Run tracks fn the same way but runs it on
// the caller's goroutine, for callers that wait for fn anyway. A call is tracked from the
// moment it is admitted: Pending lists it, and Drain waits for it. FromContext tells, from
// fn's context (or one derived from it), which executor and call it belongs to.
//
// Drain refuses new calls, optionally cancels the running calls' contexts
// (Options.CancelAfter), and waits for the tracked calls, logging a report of those still
// pending: name, age, whether a caller still waits, where the goroutine is blocked, and the
// line of the call's own function where it waits. Nothing is logged when nothing is
// pending. Outside a drain, calls running longer than Options.SlowAfter are logged the same
// way. Locate gives the same view on demand.
//
// Stacks are captured only when a report is due, when Locate is called, or when a Drain gives
// up, never per call: fn's goroutine carries the pprof label "quiesce" (added to the
// caller's labels; each executor reuses its own values, so they are bounded by the calls it
// runs at once, and hands them to the next executor New makes once its drain is over), and
// the goroutine profile, read in its protobuf form, gives each labelled goroutine's stack.
// One capture serves everyone who asks at the same time, and for a second after.
//
// Steady state is quiet: nothing is logged while no call is slow, and while the set of slow
// calls stays the same, "Slow calls" backs off (see Options.SlowAfter). Once Drain returned,
// no report follows and the executor runs no goroutine of its own.
//
// What blocks:
//   - Call blocks until fn returns or the caller's ctx ends (then fn keeps running, tracked).
//     With Options.MaxConcurrent > 0 it may first wait for a free slot.
//   - Run blocks until fn returns, even when ctx ends first (fn's context ends then). With
//     Options.MaxConcurrent > 0 it may first wait for a free slot.
//   - Go blocks only while it waits for a MaxConcurrent slot.
//   - Drain blocks until every tracked call returned or its ctx ends.
//   - Locate blocks while it captures the goroutine profile.
//   - Pending, Draining, Stats and FromContext never block.
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
// Here: New panics on a positive ReportAfter, ReportEvery or SlowAfter below its least
// value (MinReportAfter, MinReportEvery, MinSlowAfter); every other Options has a meaning. An Executor comes from New:
// Call, Go, Run and Drain of one that New did not create (a zero Executor) return an error
// wrapping ErrInvalidCall, saying so; its other methods panic. All methods of an Executor are safe for concurrent
// use, including concurrent Drains, which all wait and see the same outcome. A panic in fn
// never crashes the process, and neither does a Logger that panics.
package drain
