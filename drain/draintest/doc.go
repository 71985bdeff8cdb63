// Package draintest helps users' own test suites check that no tracked call of a
// drain.Executor is left running: a handler that ignored its context, a goroutine that
// outlived its reconcile. Such a call would run on into the next test, or be cut off when
// the process exits.
//
// After a test or spec stopped its manager (which drains the executor of a
// runnable.Runnable), assert that nothing is pending, with plain testing:
//
//	draintest.VerifyNone(t, q.Executor())
//
// or with Gomega, polling until the calls returned:
//
//	Eventually(q).Should(draintest.HaveNoPendingCalls())
//
// A failure lists each pending call with its name (quoted, cut to 256 bytes), age, whether a
// caller still waits for it, and the line where its goroutine is blocked (see
// drain.Executor.Locate). Neither VerifyNone nor the matcher ever starts a drain.
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
// Here: VerifyNone reports a nil executor as a test failure (t.Errorf), and
// HaveNoPendingCalls returns an error for an actual value that is no executor.
//
// Nothing in the package blocks. VerifyNone and HaveNoPendingCalls are safe to call
// concurrently; a matcher returned by HaveNoPendingCalls keeps the snapshot of its last
// Match for its failure message, so use one per assertion, as Gomega does.
package draintest
