package testserver

import "syscall"

// sysProcAttr puts a server in a process group of its own (so signals reach
// its children), under cred when set, and has the kernel kill it when the test
// binary dies, so a test killed by its timeout leaves no server behind.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}
