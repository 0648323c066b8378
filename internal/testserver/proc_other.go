//go:build !linux

package testserver

import "syscall"

// sysProcAttr puts a server in a process group of its own, under cred when
// set. Outside Linux there is no parent-death signal: a test binary that is
// killed leaves its servers running.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
