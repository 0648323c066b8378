//go:build !linux

package check

import "syscall"

func workerProcAttr() *syscall.SysProcAttr { return nil }
