// Package internal holds the machinery that quiesce's packages share and users do not see:
// executor settings that only a runnable.Runnable changes (Settings), the calls shaped by
// CallOptions behind reconcilers.Wrap, reconcilers.Call and the per-object daemons, the
// tracked call a context belongs to (CallOf), and the rendering of names and ages that
// reports, errors and /debug/quiesce share. It is to quiesce what pkg/internal is to
// controller-runtime.
//
// drain imports this package, so this package cannot name *drain.Executor. drain sets the
// hook CoreOf in its init (the pattern of grpc's internal package); Of gives an executor's
// Core, all typed, with nothing added to drain's public API:
//
//	err := internal.Of(ex).Go(ctx, internal.CallOptions{Name: name, Daemon: true}, fn)
//
// Nothing here blocks but the calls of Core, as their drain counterparts do.
package internal
