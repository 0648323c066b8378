package check

import "syscall"

// workerProcAttr makes a worker die with the coordinator (a killed checker
// leaves no workers behind).
func workerProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
