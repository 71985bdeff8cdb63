package shutdowntest

import (
	"errors"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// sysProcAttr: the operator runs in a process group of its own, so that a Ctrl-C in the
// terminal reaches the test alone, which then kills it: the harness alone decides which
// signal the operator gets; and so that Kill reaches every process the operator started. And
// the kernel kills the operator if the test process dies first (a test binary killed by its
// own timeout, or by SIGKILL), so that none is left behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// ownGroup: the operator leads a process group of its own.
const ownGroup = true

// waitExited blocks until the process exited, without reaping it: until it is reaped, its
// pid, and so its process group's id, cannot name another process.
func waitExited(cmd *exec.Cmd) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return // nil, or ECHILD once reaped: either way it exited
		}
	}
}

// killGroup sends SIGKILL to the operator's process group: the operator and every process it
// started that did not leave the group. Call it only before the operator is reaped.
func killGroup(cmd *exec.Cmd) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // ESRCH: nothing left to kill
}
