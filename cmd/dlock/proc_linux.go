package main

import "syscall"

// childSysProcAttr is how the guard starts CMD: in a process group of its
// own, so that signals reach it once (forwarded by dlock, never also from
// the terminal) and a lost lease or dlock's death stops everything CMD
// started. Pdeathsig kills CMD should the guard itself die abruptly (the
// guard forks from a thread that never exits, so it fires only then).
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
