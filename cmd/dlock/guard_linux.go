package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (Linux 3.4), missing from
// package syscall.
const prSetChildSubreaper = 36

// guardSetup makes the guard the subreaper of CMD's tree: a descendant
// whose parent dies is re-parented to the guard rather than to init, even
// if it left CMD's process group and session, so the guard can still find
// and kill it. It also names the guard's main thread "dlock-guard" for ps
// and top (it runs as /proc/self/exe). Both are best effort.
func guardSetup() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	name := []byte("dlock-guard\x00")
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0)
}

// guardChildren lists the guard's child processes, from /proc.
func guardChildren() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	self := os.Getpid()
	var out []int
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self {
			continue
		}
		if ppid, ok := procPPid(pid); ok && ppid == self {
			out = append(out, pid)
		}
	}
	return out
}

// procPPid reads pid's parent from /proc/PID/stat.
func procPPid(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// selfExecutable is the file to re-execute as the guard: /proc/self/exe is
// dlock's own binary even if it was replaced or deleted since dlock started.
func selfExecutable() (string, error) { return "/proc/self/exe", nil }
