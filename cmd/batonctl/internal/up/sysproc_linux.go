package up

import "syscall"

// sysProcAttr makes the kernel send SIGTERM to a service if batonctl itself
// dies, so no service outlives its launcher, and puts each service in its
// own process group, so that a terminal's Ctrl-C (SIGINT to the foreground
// group) reaches batonctl alone: batonctl then stops the services in order,
// each with one SIGTERM, instead of racing their own SIGINT.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
}
