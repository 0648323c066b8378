package main

// The guard: "dlock run" does not start CMD itself but through a small
// helper, dlock re-executed in a hidden mode, so that CMD's whole process
// group (and, on Linux, every descendant) dies when dlock dies, whatever
// kills it. See docs/cli.md, "When dlock itself dies".
//
//	dlock (holds the lease) ──▶ guard (own process group) ──▶ CMD (leads group G)
//	      write end ═══ life pipe ═══▶ read end
//	      read end  ◀══ report pipe ══ write end
//
// dlock holds the only write end of the life pipe. The guard never reads
// data from it: it waits for end of file, which comes when dlock exits, by
// any means including SIGKILL, since the kernel closes a dead process's
// descriptors. dlock also closes it on purpose to have the job killed (the
// SIGKILL step after a lost lease). On end of file the guard SIGKILLs group
// G, and on Linux, being the subreaper of CMD's tree, every descendant that
// left G (setsid) as well, until it has no children left; then it exits.
//
// Otherwise the guard waits for CMD and exits with CMD's status (128+N if
// signal N killed it), which dlock takes as CMD's own. The guard is in a
// process group of its own, not in G: the signals dlock forwards to G, a
// Ctrl-Z's SIGSTOP and the SIGKILL of a lost lease never reach it, so it
// stays able to act. It ignores (catches and drops) the usual terminating
// and stopping signals, so that "pkill" or a stray "kill" aimed at it does
// not leave CMD unguarded; CMD still gets them at their default action.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// guardArg, as dlock's first argument, selects the guard mode. It is not a
// command: the guard refuses to run unless started by "dlock run".
const guardArg = "__dlock-run-guard"

// The guard's inherited descriptors (exec.Cmd.ExtraFiles start at 3).
const (
	guardLifeFD   = 3 // read end of the life pipe: EOF means dlock is gone
	guardReportFD = 4 // write end of the report pipe: "ok PID" or "err CODE ERRNO"
)

// guardSignals are the signals the guard catches and drops. A signal it was
// started with ignored stays ignored, for CMD too, as it would without the
// guard.
var guardSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM,
	syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
}

// guardSweepEvery is how often a killing guard looks again for processes
// to kill, until CMD's tree is empty.
const guardSweepEvery = 10 * time.Millisecond

// guardGroupDeadline bounds how long a killing guard waits for group G to
// vanish after its own children are gone (members it cannot reap: without a
// subreaper, or zombies of a parent that does not reap).
const guardGroupDeadline = time.Second

func init() {
	// Before main, so that the guard runs nothing of dlock's own start-up
	// (and in the test binary, none of the tests).
	if len(os.Args) > 1 && os.Args[1] == guardArg {
		// syscall.Exit, not os.Exit: the guard has nothing to flush, and
		// dlock waits for it, so it skips the runtime's exit hooks (a race
		// detector build pauses a second there).
		syscall.Exit(guardMain(os.Args[2:], os.Stderr))
	}
}

// guardMain is the guard process: args are CMD's resolved path then its
// argv. It returns the guard's exit code.
func guardMain(args []string, stderr io.Writer) int {
	if len(args) < 2 || !isPipe(guardLifeFD) || !isPipe(guardReportFD) {
		fmt.Fprintf(stderr, "dlock: %s is an internal mode of \"dlock run\", not a command\n", guardArg)
		return exitUsage
	}
	// CMD must not inherit the guard's pipe ends (ForkExec passes only
	// stdin, stdout and stderr, but be explicit).
	syscall.CloseOnExec(guardLifeFD)
	syscall.CloseOnExec(guardReportFD)
	life := os.NewFile(guardLifeFD, "dlock-life")
	report := os.NewFile(guardReportFD, "dlock-report")

	// Catch rather than ignore: a caught signal reverts to its default
	// action in CMD, an ignored one would stay ignored there.
	sigs := make(chan os.Signal, 8)
	for _, s := range guardSignals {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	guardSetup()

	// CMD's parent-death signal (Linux) is tied to the thread that forks it:
	// fork from one that never exits.
	runtime.LockOSThread()
	path, argv := args[0], args[1:]
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env:   os.Environ(),
		Files: []uintptr{0, 1, 2},
		Sys:   childSysProcAttr(),
	})
	if err != nil {
		code := exitCannotExec
		if errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		errno := 0
		var en syscall.Errno
		if errors.As(err, &en) {
			errno = int(en)
		}
		fmt.Fprintf(report, "err %d %d\n", code, errno)
		report.Close()
		return code
	}
	fmt.Fprintf(report, "ok %d\n", pid)
	report.Close()

	lifeEnded := make(chan struct{})
	go func() {
		// dlock never writes: any return is end of file (or the pipe
		// failing, treated alike: dlock cannot be relied on any more).
		_, _ = io.Copy(io.Discard, life)
		close(lifeEnded)
	}()
	// dead is the loop's view of lifeEnded, set to nil once acted on; the
	// reader above closes its own channel, never this variable.
	var dead <-chan struct{} = lifeEnded
	type reaped struct {
		pid int
		ws  syscall.WaitStatus
	}
	reapC, noChildren := make(chan reaped), make(chan struct{})
	go func() {
		// The guard reaps all its children: CMD, and on Linux the orphans
		// of CMD's tree that the kernel re-parents to it.
		for {
			var ws syscall.WaitStatus
			p, err := syscall.Wait4(-1, &ws, 0, nil)
			switch {
			case err == syscall.EINTR:
			case err != nil:
				close(noChildren)
				return
			default:
				reapC <- reaped{p, ws}
			}
		}
	}()

	var (
		killing bool
		ticker  *time.Ticker
		tick    <-chan time.Time
		status  = 128 + int(syscall.SIGKILL)
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		select {
		case <-sigs:
		case r := <-reapC:
			if r.pid == pid {
				status = waitStatusCode(r.ws)
				if !killing && !hungUp(guardLifeFD) {
					return status
				}
				// dlock closes the life pipe before it kills CMD's group, so
				// a CMD killed by dlock may be reaped here before the reader
				// above has seen end of file: that is a kill all the same,
				// and CMD's escaped descendants must die too.
				if !killing {
					killing = true
					dead = nil
					ticker = time.NewTicker(guardSweepEvery)
					tick = ticker.C
				}
			}
			if killing {
				// Its children, if any, are the guard's now.
				guardSweep(pid)
			}
		case <-dead:
			dead = nil
			killing = true
			guardSweep(pid)
			ticker = time.NewTicker(guardSweepEvery)
			tick = ticker.C
		case <-tick:
			guardSweep(pid)
		case <-noChildren:
			// CMD's tree is empty as far as the guard can see. Members of G
			// it cannot reap get a last chance to vanish.
			deadline := time.Now().Add(guardGroupDeadline)
			for syscall.Kill(-pid, syscall.SIGKILL) == nil && time.Now().Before(deadline) {
				time.Sleep(guardSweepEvery) // poll interval
			}
			return status
		}
	}
}

// guardSweep SIGKILLs group pgid and every child of the guard's (on Linux,
// the orphans of CMD's tree that left the group).
func guardSweep(pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for _, c := range guardChildren() {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
}

// waitStatusCode is a shell's view of a wait status: the exit code, or 128+N
// if signal N killed the process.
func waitStatusCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// hungUp reports whether the pipe read end fd has no writer left, without
// waiting.
func hungUp(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1 && p[0].Revents&unix.POLLHUP != 0
	}
}

// isPipe reports whether fd is an open pipe.
func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO
}

// guardedJob is CMD running under a guard, as dlock sees it.
type guardedJob struct {
	guard *exec.Cmd
	// pgid is CMD's process group, where dlock sends signals.
	pgid int
	// life is the write end of the life pipe: closing it (or dlock's
	// death) makes the guard kill the job.
	life *os.File
	// waited delivers the guard's Wait result, once.
	waited chan error
}

// startError is a failure to start CMD: its exit code (126 or 127) and cause.
type startError struct {
	code int
	err  error
}

func (s *startError) Error() string { return s.err.Error() }

// startGuarded starts CMD (path, argv) with environ under a guard process
// with dlock's streams. A *startError means CMD could not be started (the
// guard is gone then); any other error is dlock's own failure.
func startGuarded(e *env, path string, argv, environ []string) (*guardedJob, error) {
	exe, err := selfExecutable()
	if err != nil {
		return nil, fmt.Errorf("cannot find dlock's own executable to start the guard: %w", err)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	reportR, reportW, err := os.Pipe()
	if err != nil {
		lifeR.Close()
		lifeW.Close()
		return nil, err
	}
	g := exec.Command(exe, append([]string{guardArg, path}, argv...)...)
	g.Args[0] = os.Args[0]
	g.Env = environ
	g.Stdin, g.Stdout, g.Stderr = e.stdin, e.stdout, e.stderr
	g.ExtraFiles = []*os.File{lifeR, reportW}
	// A group of its own: out of reach of the terminal's signals and of
	// the ones dlock sends to CMD's group.
	g.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// When dlock's streams are not files, goroutines copy CMD's output; do
	// not let a stray grandchild holding the pipe keep dlock waiting.
	g.WaitDelay = time.Second
	err = g.Start()
	lifeR.Close()
	reportW.Close()
	if err != nil {
		lifeW.Close()
		reportR.Close()
		return nil, fmt.Errorf("cannot start the guard process: %w", err)
	}
	j := &guardedJob{guard: g, life: lifeW, waited: make(chan error, 1)}
	go func() { j.waited <- g.Wait() }()

	line, _ := bufio.NewReader(reportR).ReadString('\n')
	reportR.Close()
	f := strings.Fields(line)
	if len(f) == 2 && f[0] == "ok" {
		if pid, err := strconv.Atoi(f[1]); err == nil && pid > 0 {
			j.pgid = pid
			return j, nil
		}
	}
	// No CMD: the guard exits at once. Wait for it, so nothing is left.
	werr := <-j.waited
	lifeW.Close()
	if len(f) == 3 && f[0] == "err" {
		code, err1 := strconv.Atoi(f[1])
		errno, err2 := strconv.Atoi(f[2])
		if err1 == nil && err2 == nil && (code == exitCannotExec || code == exitNotFound) {
			return nil, &startError{code: code, err: syscall.Errno(errno)}
		}
	}
	if werr == nil {
		werr = errors.New("it exited without starting the command")
	}
	return nil, fmt.Errorf("the guard process failed: %v (report %q)", werr, strings.TrimSpace(line))
}

// kill makes the guard SIGKILL the whole job (and SIGKILLs CMD's group
// directly too, should the guard be slow).
func (j *guardedJob) kill() {
	j.life.Close()
	_ = syscall.Kill(-j.pgid, syscall.SIGKILL)
}
