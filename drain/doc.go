// Package drain is a tracked executor: it runs named calls on tracked goroutines, refuses
// new calls once it drains, and waits for every call it admitted to really end, logging at
// an interval which calls it still waits for and where they are blocked.
//
// Call and Go run fn on a goroutine of their own, Run on the caller's; each call is
// tracked from its admission until fn returns, even when its caller stopped waiting.
// Drain's reports, and the lines on calls slower than Options.SlowAfter, give each pending
// call's name, age, whether a caller still waits, where its goroutine is blocked and the
// line of its own function. Nothing is logged while nothing is pending or slow.
//
// Stacks are captured only for a report, Locate or a Drain that gives up, never per call:
// fn's goroutine carries the pprof label "quiesce" (added to the caller's; its values are
// reused, bounded by the calls running at once), by which the goroutine profile gives each
// call's stack. One capture serves everyone who asks within a second.
//
// What blocks: Call, until fn returns or ctx ends; Run, until fn returns; Drain, until
// every call returned or ctx ends; Locate, while it captures; Call, Go and Run, while they
// wait for a MaxConcurrent slot. Nothing else.
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
// Here: New panics on a positive ReportAfter, ReportEvery or SlowAfter below MinReportAfter,
// MinReportEvery or MinSlowAfter; an Executor New did not create returns ErrInvalidCall from
// Call, Go, Run and Drain and panics elsewhere. A panic in fn, or in the Logger, never
// crashes the process.
package drain
