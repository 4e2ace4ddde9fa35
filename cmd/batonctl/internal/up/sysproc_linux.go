package up

import "syscall"

// sysProcAttr makes the kernel send SIGTERM to a service if batonctl itself
// dies, so no service outlives its launcher.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
