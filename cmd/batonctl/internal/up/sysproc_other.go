//go:build !linux

package up

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
