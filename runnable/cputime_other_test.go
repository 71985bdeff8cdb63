//go:build !unix

package runnable

import "time"

// processCPU returns false: the process's CPU time is not read on this platform.
func processCPU() (time.Duration, bool) { return 0, false }
