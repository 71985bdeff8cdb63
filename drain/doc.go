// Package drain is a tracked executor: it runs named calls on tracked goroutines, refuses new
// calls once it drains, and waits for every call it admitted to really end, logging at an
// interval which calls it still waits for and where they are blocked.
//
// An Executor runs each fn given to Call or Go on a worker goroutine of its own and tracks it
// until fn returns, even when the caller stopped waiting. Run tracks fn the same way but runs
// it on the caller's goroutine, for callers that wait for fn anyway. FromContext tells, from
// fn's context (or one derived from it), which executor and call it belongs to. Drain refuses new calls, optionally
// cancels the running calls' contexts (Options.CancelAfter), and waits for the tracked calls,
// logging a report of those still pending: name, age, whether a caller still waits, and the
// line where the goroutine is blocked. Nothing is logged when nothing is pending.
//
// What blocks:
//   - Call blocks until fn returns or the caller's ctx ends (then fn keeps running, tracked).
//     With Options.MaxConcurrent > 0 it may first wait for a free slot.
//   - Run blocks until fn returns, even when ctx ends first (fn's context ends then). With
//     Options.MaxConcurrent > 0 it may first wait for a free slot.
//   - Go blocks only while it waits for a MaxConcurrent slot.
//   - Drain blocks until every tracked call returned or its ctx ends.
//   - Pending, Draining, Stats, SetDriven, Driven and FromContext never block.
//
// All methods of an Executor are safe for concurrent use, including concurrent Drains, which
// all wait and see the same outcome. A panic in fn never crashes the process. Stacks are
// captured only when a report is due or a Drain gives up, never per call.
package drain
