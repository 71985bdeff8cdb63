// Package internal holds the machinery that quiesce's packages share and users do not see:
// executor settings that only a runnable.Runnable changes, and the tracked calls behind
// reconcilers.Wrap and reconcilers.Call. It is to quiesce what pkg/internal is to
// controller-runtime.
//
// The hooks below take the executor as any because drain imports this package (to install
// them in its init) and so this package cannot import drain.
//
// Nothing here blocks; Settings are written once, before an executor is shared, and only
// read after that.
package internal
