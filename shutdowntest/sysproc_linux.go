package shutdowntest

import "syscall"

// sysProcAttr: the kernel kills the operator if the test process dies first (a test binary
// killed by its own timeout, or by SIGKILL), so that no operator is left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
