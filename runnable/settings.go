package runnable

import (
	"time"

	"github.com/quiesce-dev/quiesce/drain"
)

// This file is the seam between runnable and drain's executor settings. Until drain's
// rewrite lands, it uses drain's public SetDriven and Options.AfterCall; afterwards, the
// settings in package internal.

// newExecutor returns a new executor for a Runnable, driven from the start (the shielding
// policy of wrapped reconciles is fixed when the Runnable is created, not when it starts),
// and, when metered, observing each call's duration.
func newExecutor(opts drain.Options, metered bool) *drain.Executor {
	if metered {
		next := opts.AfterCall
		opts.AfterCall = func(name string, took time.Duration, err error) {
			observeCall(controllerOf(name), took, err)
			if next != nil {
				next(name, took, err)
			}
		}
	}
	ex := drain.New(opts)
	ex.SetDriven(true)
	return ex
}

// controllerOf stands in for AfterCall's controller argument until drain passes it.
func controllerOf(name string) string {
	for i := range len(name) {
		if name[i] == '/' {
			return name[:i]
		}
	}
	return otherCalls
}

// slowAfterOf returns opts.SlowAfter once drain has it.
func slowAfterOf(drain.Options) time.Duration { return 0 }

// located returns ex's pending calls, oldest first, with Where and Handler filled once
// drain can locate them without draining.
func located(ex *drain.Executor) []drain.Pending { return ex.Pending() }

// handlerOf returns p.Handler once drain has it.
func handlerOf(drain.Pending) string { return "" }
