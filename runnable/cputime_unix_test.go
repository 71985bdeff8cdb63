//go:build unix

package runnable

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user and system, every thread) the process used so
// far; false where it is not known.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
