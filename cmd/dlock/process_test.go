package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite", to tamper with the lock table
)

// procEnv is the environment of a dlock process under test: this process's,
// without any dlock or XDG settings, plus DLOCK_URL and a private HOME.
func procEnv(t *testing.T, dbURL string) []string {
	return append(bareProcEnv(t), "DLOCK_URL="+dbURL)
}

// bareProcEnv is procEnv without DLOCK_URL.
func bareProcEnv(t *testing.T) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DLOCK_") || strings.HasPrefix(kv, "XDG_STATE_HOME=") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "HOME="+t.TempDir())
}

// startDlock starts the dlock binary with args and collects its output.
func startDlock(t *testing.T, dbURL string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	return startDlockEnv(t, procEnv(t, dbURL), args...)
}

// startDlockEnv is startDlock with the whole environment given.
func startDlockEnv(t *testing.T, environ []string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(dlockBinary(t), args...)
	cmd.Env = environ
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// A job's leftover process holding the output pipe must not keep Wait
	// from returning once dlock has exited.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, out
}

// waitExit waits for cmd with a deadline and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("wait: %v", err)
		}
		return exitStatus(cmd.ProcessState)
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("dlock did not exit within %v", d)
		return -1
	}
}

// TestProcessMutualExclusion: eight dlock processes race for one lock on one
// SQLite file; each child does an unprotected read-modify-write of a counter
// file and appends its token to a log.
func TestProcessMutualExclusion(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	dir := t.TempDir()
	counter, log := filepath.Join(dir, "counter"), filepath.Join(dir, "tokens")
	if err := os.WriteFile(counter, []byte("0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The sleep widens the window in which an unlocked run would lose an update.
	script := `n=$(cat "$1"); sleep 0.02; echo $((n+1)) > "$1"; echo "$DLOCK_TOKEN" >> "$2"`
	const n = 8
	cmds := make([]*exec.Cmd, n)
	outs := make([]*syncBuffer, n)
	for i := range cmds {
		cmds[i], outs[i] = startDlock(t, dbURL, "run", "--ttl", "10s", "counter", "--", "sh", "-c", script, "sh", counter, log)
	}
	for i, cmd := range cmds {
		if code := waitExit(t, cmd, 2*time.Minute); code != 0 {
			t.Errorf("dlock %d: exit %d: %s", i, code, outs[i])
		}
	}
	if got := readFile(t, counter); got != strconv.Itoa(n) {
		t.Fatalf("counter %s after %d locked increments: lost update", got, n)
	}
	lines := strings.Fields(readFile(t, log))
	if len(lines) != n {
		t.Fatalf("token log has %d lines, want %d: %q", len(lines), n, lines)
	}
	var prev uint64
	for i, l := range lines {
		tok, err := strconv.ParseUint(l, 10, 64)
		if err != nil || tok <= prev {
			t.Fatalf("token %d is %q after %d: not strictly increasing (%q)", i, l, prev, lines)
		}
		prev = tok
	}

	// status (as a process) sees the last token and a free lock.
	cmd, out := startDlock(t, dbURL, "status", "--json")
	if code := waitExit(t, cmd, time.Minute); code != 0 {
		t.Fatalf("status: exit %d: %s", code, out)
	}
	var rows []lockJSON
	if err := json.Unmarshal([]byte(out.String()), &rows); err != nil {
		t.Fatalf("status --json %q: %v", out, err)
	}
	if len(rows) != 1 || rows[0].Name != "counter" || rows[0].Token != prev || rows[0].Owner != "" {
		t.Fatalf("status --json after the runs: %s", out)
	}
}

func TestProcessNotAcquired(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	holdLock(t, dbURL, "busy", nil)
	marker := filepath.Join(t.TempDir(), "ran")

	cmd, out := startDlock(t, dbURL, "run", "--no-wait", "busy", "--", "touch", marker)
	if code := waitExit(t, cmd, time.Minute); code != exitNotAcquired {
		t.Fatalf("--no-wait: exit %d, want %d: %s", code, exitNotAcquired, out)
	}

	start := time.Now()
	cmd, out = startDlock(t, dbURL, "run", "--wait", "300ms", "busy", "--", "touch", marker)
	if code := waitExit(t, cmd, time.Minute); code != exitNotAcquired {
		t.Fatalf("--wait 300ms: exit %d, want %d: %s", code, exitNotAcquired, out)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("--wait 300ms exited after %v", el)
	}
	if fileExists(marker)() {
		t.Fatal("the child ran although the lock was not acquired")
	}
}

func TestProcessExitCodes(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	for _, tc := range []struct {
		script string
		want   int
	}{
		{"exit 0", 0},
		{"exit 3", 3},
		{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
	} {
		cmd, out := startDlock(t, dbURL, "run", "codes", "--", "sh", "-c", tc.script)
		if code := waitExit(t, cmd, time.Minute); code != tc.want {
			t.Errorf("%q: exit %d, want %d: %s", tc.script, code, tc.want, out)
		}
	}
	cmd, out := startDlock(t, dbURL, "run", "--bogus", "codes", "--", "true")
	if code := waitExit(t, cmd, time.Minute); code != exitUsage {
		t.Errorf("bad flag: exit %d, want %d: %s", code, exitUsage, out)
	}
}

func TestProcessSignalForwarding(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			ready, got := filepath.Join(dir, "ready"), filepath.Join(dir, "got")
			name := strings.TrimPrefix(sigName(sig), "SIG")
			script := `trap 'echo ` + name + ` >> "$2"; exit 7' ` + name + `; touch "$1"; while :; do sleep 0.01; done`
			cmd, out := startDlock(t, dbURL, "run", "fwd", "--", "sh", "-c", script, "sh", ready, got)
			waitFor(t, "child to start", time.Minute, fileExists(ready))
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, time.Minute); code != 7 {
				t.Fatalf("exit %d, want the child's 7: %s", code, out)
			}
			if s := readFile(t, got); s != name {
				t.Fatalf("child's trap log %q, want %s once", s, name)
			}
			// Released: the next run gets the lock at once.
			cmd, out = startDlock(t, dbURL, "run", "--no-wait", "fwd", "--", "true")
			if code := waitExit(t, cmd, time.Minute); code != 0 {
				t.Fatalf("lock not released after the child exited: exit %d: %s", code, out)
			}
		})
	}
}

// TestProcessLeaseLost takes the lease away behind dlock's back, by
// rewriting the lock's row in the SQLite file, and expects the child to be
// stopped and dlock to exit 76.
func TestProcessLeaseLost(t *testing.T) {
	dbURL, path := sqliteTestURL(t)
	dir := t.TempDir()
	ready, got := filepath.Join(dir, "ready"), filepath.Join(dir, "got")
	cmd, out := startDlock(t, dbURL, "run", "--ttl", "600ms", "--kill-grace", "5s", "lost", "--", "sh", "-c",
		`trap 'echo TERM > "$2"; exit 0' TERM; touch "$1"; while :; do sleep 0.01; done`, "sh", ready, got)
	waitFor(t, "child to start", time.Minute, fileExists(ready))

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "PRAGMA busy_timeout = 10000"); err != nil {
		t.Fatal(err)
	}
	res, err := db.ExecContext(ctx, `UPDATE dlock_locks SET owner = 'intruder' WHERE name = 'lost' AND count > 0`)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("tampering updated %d rows, want 1", n)
	}
	if code := waitExit(t, cmd, time.Minute); code != exitLeaseLost {
		t.Fatalf("exit %d, want %d: %s", code, exitLeaseLost, out)
	}
	if s := readFile(t, got); s != "TERM" {
		t.Fatalf("child got %q, want TERM", s)
	}
	if !strings.Contains(out.String(), "lease") || !strings.Contains(out.String(), "lost") {
		t.Fatalf("output %q does not report the loss", out)
	}
}

// TestProcessDlockKilled: if dlock itself is killed, nobody renews the lease,
// so its child must not outlive it.
func TestProcessDlockKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux-only")
	}
	dbURL, _ := sqliteTestURL(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, _ := startDlock(t, dbURL, "run", "orphan", "--", "sh", "-c",
		`echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; while :; do sleep 0.01; done`, "sh", pidFile)
	waitFor(t, "child to start", time.Minute, fileExists(pidFile))
	pid, err := strconv.Atoi(readFile(t, pidFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitFor(t, fmt.Sprintf("child %d to die with dlock", pid), 30*time.Second, func() bool { return !alive(pid) })
}

// alive reports whether pid runs (a zombie does not count).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	st := procState(pid)
	return st != 0 && st != 'Z'
}

// procState is pid's state letter from /proc (R, S, T, Z, ...), 0 if gone.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2]
	}
	return 0
}

// stopped reports whether pid runs nothing until it is continued: it is
// stopped (state T), or a SIGSTOP is pending on it, which stops it as soon
// as it leaves the uninterruptible wait it is in. A shell that vforks (dash
// does, for "sleep" in a loop) waits so for a child that the job's SIGSTOP
// caught before its exec, in state D until the child is continued; SIGCONT
// discards the pending SIGSTOP. False if pid is gone.
func stopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	stop := uint64(1) << (uint(syscall.SIGSTOP) - 1)
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			if strings.HasPrefix(v, "T") {
				return true
			}
		case "SigPnd", "ShdPnd":
			if m, err := strconv.ParseUint(v, 16, 64); err == nil && m&stop != 0 {
				return true
			}
		}
	}
	return false
}

// startStoppable starts dlock running a child that writes its pid to a file
// and loops until a release file appears; SIGTERM makes it log TERM and exit.
func startStoppable(t *testing.T, dbURL string, flags ...string) (cmd *exec.Cmd, out *syncBuffer, childPid int, release, got string) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads process states from /proc")
	}
	dir := t.TempDir()
	pidFile, release, got := filepath.Join(dir, "pid"), filepath.Join(dir, "release"), filepath.Join(dir, "got")
	args := append([]string{"run"}, flags...)
	args = append(args, "jobctl", "--", "sh", "-c",
		`trap 'echo TERM > "$3"; exit 0' TERM; echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; while [ ! -e "$2" ]; do sleep 0.01; done`,
		"sh", pidFile, release, got)
	cmd, out = startDlock(t, dbURL, args...)
	waitFor(t, "child to start", time.Minute, fileExists(pidFile))
	pid, err := strconv.Atoi(readFile(t, pidFile))
	if err != nil {
		t.Fatal(err)
	}
	return cmd, out, pid, release, got
}

// TestProcessJobControl: Ctrl-Z (SIGTSTP to dlock) stops the child's group
// and then dlock; SIGCONT (fg) resumes both.
func TestProcessJobControl(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	cmd, out, child, release, _ := startStoppable(t, dbURL)
	if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "child and dlock to stop", time.Minute, func() bool {
		return stopped(child) && stopped(cmd.Process.Pid)
	})
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "child to resume", time.Minute, func() bool { return !stopped(child) && procState(child) != 0 })
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, time.Minute); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
}

// TestProcessStoppedPastTTL: dlock stopped (Ctrl-Z) longer than its TTL
// loses the lease to someone else; on fg the child is not simply resumed but
// told to stop, and dlock exits 76.
func TestProcessStoppedPastTTL(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	// A TTL long enough that a loaded machine does not lose the lease
	// before the stop (dlock would then end CMD, which never stops), and
	// short enough that it runs out while dlock is stopped.
	cmd, out, child, _, got := startStoppable(t, dbURL, "--ttl", "1500ms")
	if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "child and dlock to stop", time.Minute, func() bool {
		return stopped(child) && stopped(cmd.Process.Pid)
	})
	// The lease expires on the server while dlock is stopped: take the lock.
	c := openClient(t, dbURL)
	var (
		next    uint64
		lastErr error
	)
	defer func() {
		// "database is locked" (SQLITE_BUSY) here is dlock stopped inside
		// a write on the file, which blocks every other client until fg.
		if t.Failed() && lastErr != nil {
			t.Logf("last TryLock error: %v", lastErr)
		}
	}()
	waitFor(t, "the stopped holder's lease to expire", time.Minute, func() bool {
		l, err := c.NewMutex("jobctl", nil).TryLock(context.Background())
		if err == nil {
			next = l.Token()
		}
		lastErr = err
		return err == nil
	})
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, time.Minute); code != exitLeaseLost {
		t.Fatalf("exit %d, want %d: %s", code, exitLeaseLost, out)
	}
	if s := readFile(t, got); s != "TERM" {
		t.Fatalf("child got %q, want TERM", s)
	}
	if next < 2 {
		t.Fatalf("new holder's token %d, want above the stopped holder's", next)
	}
}

// TestProcessKeepsIgnoredSignals: a signal dlock was started with ignored
// (nohup's SIGHUP) stays ignored while it runs, rather than being caught
// and forwarded.
func TestProcessKeepsIgnoredSignals(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads signal masks from /proc")
	}
	dbURL, _ := sqliteTestURL(t)
	dir := t.TempDir()
	ready, release := filepath.Join(dir, "ready"), filepath.Join(dir, "release")
	cmd := exec.Command("sh", "-c", `trap '' HUP; exec "$@"`, "sh", dlockBinary(t), "run", "nohup", "--", "sh", "-c",
		`touch "$1"; while [ ! -e "$2" ]; do sleep 0.01; done`, "sh", ready, release)
	cmd.Env = procEnv(t, dbURL)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "child to start", time.Minute, fileExists(ready))
	ign, cgt := sigMasks(t, cmd.Process.Pid)
	hup := uint64(1) << (uint(syscall.SIGHUP) - 1)
	term := uint64(1) << (uint(syscall.SIGTERM) - 1)
	if ign&hup == 0 || cgt&hup != 0 {
		t.Errorf("SIGHUP ignored at start is no longer ignored (SigIgn %x, SigCgt %x)", ign, cgt)
	}
	if cgt&term == 0 {
		t.Errorf("SIGTERM not caught (SigCgt %x)", cgt)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, time.Minute); code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
}

// sigMasks reads a process's ignored and caught signal masks.
func sigMasks(t *testing.T, pid int) (ign, cgt uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "SigIgn":
			ign, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		case "SigCgt":
			cgt, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return ign, cgt
}

// startWithPids starts "dlock run NAME -- sh -c script sh pidFile" and waits
// for the script to write pidFile (via a temporary file, so it is never read
// half-written); it returns dlock and the pids in the file, one a line. Every
// pid is SIGKILLed at cleanup, so a failing test leaves nothing running.
func startWithPids(t *testing.T, dbURL, name, script string, flags ...string) (*exec.Cmd, *syncBuffer, []int) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reads process states from /proc")
	}
	pidFile := filepath.Join(t.TempDir(), "pids")
	args := append(append([]string{"run"}, flags...), name, "--", "sh", "-c", script, "sh", pidFile)
	cmd, out := startDlock(t, dbURL, args...)
	waitFor(t, "the job to write its pids", time.Minute, fileExists(pidFile))
	var pids []int
	for _, f := range strings.Fields(readFile(t, pidFile)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pid file: %v", err)
		}
		pids = append(pids, pid)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	return cmd, out, pids
}

// waitAllDead polls until none of pids runs (zombies count as dead).
func waitAllDead(t *testing.T, what string, pids []int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s %v to die", what, pids), 10*time.Second, func() bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	})
}

// killDlock SIGKILLs dlock and reaps it.
func killDlock(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// TestProcessDlockKilledGrandchild: SIGKILL of dlock kills all of CMD's
// process group, not only CMD: here a grandchild in the background, which
// used to be re-parented to init and run on without the lock.
func TestProcessDlockKilledGrandchild(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	cmd, _, pids := startWithPids(t, dbURL, "orphan",
		`sleep 300 & echo $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`)
	killDlock(t, cmd)
	waitAllDead(t, "grandchild", pids)
}

// TestProcessDlockKilledEscapee: a descendant that left CMD's process
// group and session (setsid) dies with dlock too: the guard is its
// subreaper and kills every descendant (Linux).
func TestProcessDlockKilledEscapee(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid command")
	}
	dbURL, _ := sqliteTestURL(t)
	// The inner sh has its own session; its child sleep is a grandchild of
	// that, and the inner sh exits at once, orphaning it.
	cmd, _, pids := startWithPids(t, dbURL, "escapee",
		`setsid sh -c 'sleep 300 & echo $! > "$1.e"' sh "$1" & wait; sleep 300 & echo $(cat "$1.e") $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`)
	killDlock(t, cmd)
	waitAllDead(t, "escaped descendant and grandchild", pids)
}

// TestProcessDlockKilledWhileStopped: Ctrl-Z stops the job, then dlock is
// SIGKILLed: the stopped job is killed, not left to be resumed later
// without the lock. (The kernel's SIGHUP and SIGCONT to an orphaned stopped
// group would not do: the grandchild here ignores SIGHUP, as under nohup.)
func TestProcessDlockKilledWhileStopped(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	cmd, _, pids := startWithPids(t, dbURL, "stopped",
		`(trap '' HUP; exec sleep 300) & echo $$ $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`)
	if err := cmd.Process.Signal(syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job and dlock to stop", time.Minute, func() bool {
		return stopped(pids[0]) && stopped(pids[1]) && stopped(cmd.Process.Pid)
	})
	killDlock(t, cmd)
	waitAllDead(t, "stopped job", pids)
}

// parentOf is pid's parent from /proc, 0 if pid is gone.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...
	s := string(b)
	var ppid int
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		var state string
		_, _ = fmt.Sscan(s[i+1:], &state, &ppid)
	}
	return ppid
}

// childrenOf lists pid's child processes, from /proc.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	names, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, n := range names {
		c, err := strconv.Atoi(filepath.Base(n))
		if err != nil {
			continue
		}
		if parentOf(c) == pid {
			out = append(out, c)
		}
	}
	return out
}

// TestProcessGuardKilled: the guard between dlock and CMD ignores the usual
// signals, and if it is SIGKILLed all the same, dlock kills CMD's group,
// releases the lock and exits 70 rather than leave CMD unguarded.
func TestProcessGuardKilled(t *testing.T) {
	dbURL, _ := sqliteTestURL(t)
	cmd, out, pids := startWithPids(t, dbURL, "guard",
		`sleep 300 & echo $$ $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`)
	kids := childrenOf(t, cmd.Process.Pid)
	if len(kids) != 1 {
		t.Fatalf("dlock has children %v, want one guard", kids)
	}
	guard := kids[0]
	if pp := parentOf(pids[0]); pp != guard {
		t.Fatalf("CMD's parent is %d, want the guard %d", pp, guard)
	}
	_, cgt := sigMasks(t, guard)
	for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTSTP} {
		if cgt&(1<<(uint(s)-1)) == 0 {
			t.Errorf("the guard does not catch %v (SigCgt %x)", s, cgt)
		}
	}
	if err := syscall.Kill(guard, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, time.Minute); code != exitInternal {
		t.Fatalf("exit %d, want %d: %s", code, exitInternal, out)
	}
	if !strings.Contains(out.String(), "guard") {
		t.Errorf("output %q does not say what happened", out)
	}
	waitAllDead(t, "unguarded job", pids)
	cmd, out = startDlock(t, dbURL, "run", "--no-wait", "guard", "--", "true")
	if code := waitExit(t, cmd, time.Minute); code != 0 {
		t.Fatalf("lock not released: exit %d: %s", code, out)
	}
}

// TestProcessLeaseLostKillsEscapee: a lost lease's SIGKILL step reaches
// descendants that left CMD's group (setsid) too, through the guard.
func TestProcessLeaseLostKillsEscapee(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid command")
	}
	dbURL, path := sqliteTestURL(t)
	cmd, out, pids := startWithPids(t, dbURL, "lost-escapee",
		`setsid sh -c 'sleep 300 & echo $! > "$1.e"' sh "$1" & wait; echo $(cat "$1.e") > "$1.tmp"; mv "$1.tmp" "$1"; while :; do sleep 0.01; done`,
		"--ttl", "600ms", "--kill-grace", "0")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "PRAGMA busy_timeout = 10000"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE dlock_locks SET owner = 'intruder' WHERE name = 'lost-escapee' AND count > 0`); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, time.Minute); code != exitLeaseLost {
		t.Fatalf("exit %d, want %d: %s", code, exitLeaseLost, out)
	}
	waitAllDead(t, "escaped descendant", pids)
}

// TestProcessGuardModeRefused: the guard's hidden mode is no command.
func TestProcessGuardModeRefused(t *testing.T) {
	cmd, out := startDlock(t, "mem://x", guardArg, "/bin/true", "true")
	if code := waitExit(t, cmd, time.Minute); code != exitUsage {
		t.Fatalf("exit %d, want %d: %s", code, exitUsage, out)
	}
	if !strings.Contains(out.String(), "internal") {
		t.Fatalf("output %q does not explain", out)
	}
}
