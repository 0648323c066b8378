package main

import "syscall"

// childSysProcAttr puts CMD in a process group of its own, so that signals
// reach it once (forwarded by dlock, never also from the terminal) and a
// lost lease stops everything CMD started. Pdeathsig kills CMD if dlock
// itself dies abruptly (SIGKILL), since nobody would renew its lease.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
