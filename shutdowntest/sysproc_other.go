//go:build !linux

package shutdowntest

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; Kill and Start's context still bound
// the operator.
func sysProcAttr() *syscall.SysProcAttr { return nil }
