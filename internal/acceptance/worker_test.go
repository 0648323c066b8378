// Package acceptance runs dlock's public API (DESIGN §1 only) from several
// operating-system processes against real backends: mutual exclusion, token
// order, hand-off, a killed holder, a paused (SIGSTOP) holder, Close, and bad
// input. Each backend's test file supplies URLs; the scenarios are shared.
package acceptance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

const workerEnv = "DLOCK_ACCEPTANCE_WORKER_URL"

// TestWorker is not a test: it is the body of a worker process, started by
// startWorker with the URL in the environment. It reads commands on stdin
// and reports on stdout, one line each.
func TestWorker(t *testing.T) {
	url := os.Getenv(workerEnv)
	if url == "" {
		t.Skip("worker process body: only runs as a child of the multi-process tests")
	}
	os.Exit(runWorker(url, os.Stdin, os.Stdout))
}

func runWorker(url string, in io.Reader, out io.Writer) int {
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(out, format+"\n", args...)
		outMu.Unlock()
	}
	ctx := context.Background()
	c, err := dlock.Open(ctx, url)
	if err != nil {
		say("error open: %v", err)
		return 2
	}
	defer c.Close()
	say("ready %d", os.Getpid())
	var lease *dlock.Lease
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		arg := func(i int) string {
			if i < len(f) {
				return f[i]
			}
			return ""
		}
		dur := func(i int) time.Duration {
			d, _ := time.ParseDuration(arg(i))
			return d
		}
		switch f[0] {
		case "lock", "trylock": // lock NAME TTL [LOCKDELAY]
			m := c.NewMutex(arg(1), &dlock.MutexOptions{TTL: dur(2), LockDelay: dur(3), WaitMax: 50 * time.Millisecond})
			var l *dlock.Lease
			if f[0] == "lock" {
				l, err = m.Lock(ctx)
			} else {
				l, err = m.TryLock(ctx)
			}
			switch {
			case err == nil:
				lease = l
				say("locked %d", l.Token())
				go func(l *dlock.Lease) {
					<-l.Done()
					if errors.Is(l.Err(), dlock.ErrLeaseLost) {
						say("lost %v", l.Err())
					}
				}(l)
			case errors.Is(err, dlock.ErrLocked):
				say("busy")
			default:
				say("error %v", err)
			}
		case "unlock":
			if lease == nil {
				say("error no lease")
				continue
			}
			switch err := lease.Unlock(ctx); {
			case err == nil:
				say("unlocked")
			case errors.Is(err, dlock.ErrNotHeld):
				say("notheld")
			default:
				say("error %v", err)
			}
		case "held": // is the current lease still valid?
			if lease != nil && lease.Err() == nil {
				say("held %d", lease.Token())
			} else {
				say("notheld")
			}
		case "loop": // loop NAME N FILE: N critical sections appending to FILE
			n, _ := strconv.Atoi(arg(2))
			if err := loop(ctx, c, arg(1), n, arg(3)); err != nil {
				say("error %v", err)
			} else {
				say("looped")
			}
		case "close":
			if err := c.Close(); err != nil {
				say("error %v", err)
			} else {
				say("closed")
			}
		case "exit":
			return 0
		default:
			say("error unknown command %q", f[0])
		}
	}
	return 0
}

// loop takes the lock n times; inside each critical section it appends a
// start and an end record to file, so overlaps show in the file.
func loop(ctx context.Context, c *dlock.Client, name string, n int, file string) error {
	m := c.NewMutex(name, &dlock.MutexOptions{WaitMax: 20 * time.Millisecond})
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := 0; i < n; i++ {
		l, err := m.Lock(ctx)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(f, "start %d %d\n", l.Token(), os.Getpid()); err != nil {
			return err
		}
		if _, err := fmt.Fprintf(f, "end %d %d\n", l.Token(), os.Getpid()); err != nil {
			return err
		}
		if err := l.Unlock(ctx); err != nil {
			return err
		}
	}
	return nil
}

// worker is a running worker process, seen from the scenario.
type worker struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	pid   int
}

func startWorker(t *testing.T, url string) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorker$", "-test.count=1")
	cmd.Env = append(os.Environ(), workerEnv+"="+url)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(w.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		<-done
	})
	ready := w.expect("ready", 30*time.Second)
	w.pid, _ = strconv.Atoi(strings.TrimPrefix(ready, "ready "))
	return w
}

func (w *worker) send(cmd string) {
	w.t.Helper()
	if _, err := io.WriteString(w.stdin, cmd+"\n"); err != nil {
		w.t.Fatalf("worker %d: send %q: %v", w.pid, cmd, err)
	}
}

// expect waits for the next line starting with prefix, failing on an
// "error" line, a different line, or the deadline.
func (w *worker) expect(prefix string, d time.Duration) string {
	w.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				w.t.Fatalf("worker %d exited while waiting for %q", w.pid, prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
			if strings.HasPrefix(line, "lost") && prefix != "lost" {
				continue // reported asynchronously; scenarios check it explicitly
			}
			w.t.Fatalf("worker %d: got %q, want %q", w.pid, line, prefix)
		case <-timer.C:
			w.t.Fatalf("worker %d: no %q within %v", w.pid, prefix, d)
		}
	}
}

// do sends cmd and waits for a reply starting with prefix.
func (w *worker) do(cmd, prefix string, d time.Duration) string {
	w.t.Helper()
	w.send(cmd)
	return w.expect(prefix, d)
}

func token(t *testing.T, line string) uint64 {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 2 {
		t.Fatalf("no token in %q", line)
	}
	n, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("bad token in %q", line)
	}
	return n
}
