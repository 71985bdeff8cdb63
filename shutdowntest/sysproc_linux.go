package shutdowntest

import "syscall"

// sysProcAttr: the operator runs in a process group of its own, so that a Ctrl-C in the
// terminal reaches the test alone, which then kills it: the harness alone decides which
// signal the operator gets. And the kernel kills the operator if the test process dies first
// (a test binary killed by its own timeout, or by SIGKILL), so that none is left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
