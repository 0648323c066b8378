package testserver

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// signalTree sends sig to process pid, to its process group and to every
// descendant, and returns the pids it signalled. Descendants matter because
// some servers move their children into groups of their own (PostgreSQL
// backends call setsid). For SIGKILL and SIGSTOP the leader is stopped first,
// so it cannot fork while its children are collected.
func signalTree(pid int, sig syscall.Signal) []int {
	if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	pids := append([]int{pid}, descendants(pid)...)
	_ = syscall.Kill(-pid, sig)
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
	return pids
}

// procStat is the part of /proc/<pid>/stat this file needs.
type procStat struct {
	pid, ppid int
	state     byte
}

func readProcs() []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || len(f[0]) == 0 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, procStat{pid: pid, ppid: ppid, state: f[0][0]})
	}
	return out
}

// descendants returns the pids of every live descendant of pid.
func descendants(pid int) []int {
	children := map[int][]int{}
	for _, p := range readProcs() {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// waitGone waits until none of pids is a live (non-zombie) process, so that
// ports and shared memory are released before a restart.
func waitGone(pids []int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		alive := 0
		for _, p := range pids {
			if processAlive(p) {
				alive++
			}
		}
		if alive == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testserver: %d server processes still alive after SIGKILL", alive)
		}
		time.Sleep(10 * time.Millisecond) // polling the kernel's process table; there is nothing to wait on
	}
}

func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil && !os.IsNotExist(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}
