//go:build !linux

package shutdowntest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr: no process group nor parent-death signal outside Linux; Kill and Start's
// context still bound the operator itself.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// ownGroup: outside Linux the operator shares the test's process group; the harness kills
// the operator alone.
const ownGroup = false

// waitExited is never called: ownGroup is false.
func waitExited(*exec.Cmd) {}

// killGroup kills the operator alone.
func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
