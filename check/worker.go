package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/check/internal/broken"
)

// WorkerEnv is the environment variable that carries a worker process's
// settings (JSON). A program started as Config.WorkerCommand finds it set and
// must call WorkerMain.
const WorkerEnv = "DLOCK_CHECK_WORKER"

// workerConfig is what the coordinator tells one worker process.
type workerConfig struct {
	URL        string        `json:"url"`
	Index      int           `json:"index"`
	Goroutines int           `json:"goroutines"`
	Locks      []string      `json:"locks"`
	TTL        time.Duration `json:"ttl"`
	LockDelay  time.Duration `json:"lock_delay"`
	HoldMin    time.Duration `json:"hold_min"`
	HoldMax    time.Duration `json:"hold_max"`
	// Resource is the fenced resource's loopback address.
	Resource string `json:"resource"`
}

// kindReady is the line a worker writes once its client is open; it is not
// part of the history.
const kindReady Kind = "ready"

// IsWorker reports whether this process was started as a checker worker
// (WorkerEnv is set).
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// WorkerMain is the body of a worker process: it reads its settings from
// WorkerEnv, runs its goroutines against the backend, writes its events as
// JSON lines on stdout, and stops when stdin closes. It returns the process's
// exit code: 0 after a clean stop, 2 when it could not start. The scheme
// "checkbroken" (the deliberately broken test driver) is registered here
// only, never in a program that merely imports this package.
func WorkerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "check worker: bad %s: %v\n", WorkerEnv, err)
		return 2
	}
	broken.Register()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the coordinator closes stdin to stop us
		cancel()
	}()
	return runWorker(ctx, cfg, os.Stdout)
}

// emitter writes events as JSON lines, one flush per event so the
// coordinator sees them at once.
type emitter struct {
	mu     sync.Mutex
	w      *bufio.Writer
	enc    *json.Encoder
	worker int
}

func newEmitter(w io.Writer, worker int) *emitter {
	bw := bufio.NewWriter(w)
	return &emitter{w: bw, enc: json.NewEncoder(bw), worker: worker}
}

func (e *emitter) emit(ev Event) {
	ev.Worker = e.worker
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev)
	_ = e.w.Flush()
}

func runWorker(ctx context.Context, cfg workerConfig, out io.Writer) int {
	em := newEmitter(out, cfg.Index)
	fail := func(format string, args ...any) int {
		ev := stamp(KindPanic)
		ev.Goroutine = -1
		ev.Err = fmt.Sprintf(format, args...)
		em.emit(ev)
		return 2
	}
	// One connection to the fenced resource per goroutine, opened before
	// the baseline of the leak check.
	conns := make([]*resourceConn, cfg.Goroutines)
	for i := range conns {
		rc, err := dialResource(cfg.Resource, cfg.Index)
		if err != nil {
			return fail("fenced resource: %v", err)
		}
		conns[i] = rc
		defer rc.Close()
	}
	baseG, baseS := runtime.NumGoroutine(), countSockets()

	c, err := dlock.Open(ctx, cfg.URL)
	if err != nil {
		return fail("open: %v", err)
	}
	em.emit(Event{Kind: kindReady})
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &goroutine{cfg: &cfg, c: c, em: em, g: g, res: conns[g], rng: rand.New(rand.NewPCG(uint64(cfg.Index), uint64(g)^uint64(time.Now().UnixNano())))}
			w.loop(ctx)
		}()
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		ev := stamp(KindLeak)
		ev.Goroutine = -1
		ev.Err = "Close: " + err.Error()
		em.emit(ev)
	}
	if msg := settleLeaks(baseG, baseS, 5*time.Second); msg != "" {
		ev := stamp(KindLeak)
		ev.Goroutine = -1
		ev.Err = msg
		em.emit(ev)
	}
	return 0
}

// settleLeaks waits up to limit for the goroutine and socket counts to come
// back to their baselines, and describes what is left over ("" if nothing).
func settleLeaks(baseG, baseS int, limit time.Duration) string {
	deadline := time.Now().Add(limit)
	for {
		g, s := runtime.NumGoroutine(), countSockets()
		if g <= baseG && s <= baseS {
			return ""
		}
		if time.Now().After(deadline) {
			var parts []string
			if g > baseG {
				buf := make([]byte, 1<<16)
				buf = buf[:runtime.Stack(buf, true)]
				parts = append(parts, fmt.Sprintf("%d goroutines left after Close (%d before Open): %s", g, baseG, firstFrames(string(buf), 6)))
			}
			if s > baseS {
				parts = append(parts, fmt.Sprintf("%d sockets open after Close (%d before Open)", s, baseS))
			}
			return strings.Join(parts, "; ")
		}
		time.Sleep(20 * time.Millisecond) // polling the condition, bounded by deadline
	}
}

// firstFrames keeps the first function line of up to n goroutine stacks.
func firstFrames(dump string, n int) string {
	var out []string
	for _, st := range strings.Split(dump, "\n\n") {
		lines := strings.Split(st, "\n")
		if len(lines) > 1 {
			out = append(out, strings.TrimSpace(lines[1]))
		}
		if len(out) == n {
			break
		}
	}
	return strings.Join(out, " | ")
}

// countSockets counts this process's open sockets (-1 when /proc is not
// there, which makes the socket check pass).
func countSockets() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// goroutine is one contending goroutine of a worker.
type goroutine struct {
	cfg *workerConfig
	c   *dlock.Client
	em  *emitter
	g   int
	op  int64
	res *resourceConn
	rng *rand.Rand
}

func (w *goroutine) event(k Kind, lock string) Event {
	ev := stamp(k)
	ev.Goroutine, ev.Lock, ev.Op = w.g, lock, w.op
	return ev
}

func (w *goroutine) loop(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			ev := w.event(KindPanic, "")
			ev.Err = fmt.Sprintf("panic: %v\n%s", r, debug.Stack())
			w.em.emit(ev)
		}
	}()
	mo := &dlock.MutexOptions{TTL: w.cfg.TTL, LockDelay: w.cfg.LockDelay, WaitMax: w.cfg.TTL / 4}
	for ctx.Err() == nil {
		lock := w.cfg.Locks[w.rng.IntN(len(w.cfg.Locks))]
		w.op++
		w.em.emit(w.event(KindRequest, lock))
		l, err := w.c.NewMutex(lock, mo).Lock(ctx)
		if err != nil {
			ev := w.event(KindAcquireError, lock)
			ev.Err = err.Error()
			w.em.emit(ev)
			if ctx.Err() != nil {
				return
			}
			// The backend failed (a fault is on): try again soon, not in
			// a hot loop.
			pause(ctx, time.Duration(10+w.rng.IntN(40))*time.Millisecond)
			continue
		}
		w.hold(ctx, l)
		pause(ctx, time.Duration(w.rng.IntN(3))*time.Millisecond)
	}
}

// hold records the grant, writes through the fenced resource while the lease
// is valid, and unlocks.
func (w *goroutine) hold(ctx context.Context, l *dlock.Lease) {
	now := mono()
	ev := w.event(KindGrant, l.Name())
	ev.Mono = now
	ev.Token = l.Token()
	ev.ValidUntil = validUntil(now, l)
	w.em.emit(ev)
	op := w.op
	stop := context.AfterFunc(l.Context(), func() {
		ev := stamp(KindDone)
		ev.Goroutine, ev.Lock, ev.Op, ev.Token = w.g, l.Name(), op, l.Token()
		if err := l.Err(); err != nil {
			ev.Err = err.Error()
		}
		w.em.emit(ev)
	})
	defer stop()

	holdFor := w.cfg.HoldMin
	if span := w.cfg.HoldMax - w.cfg.HoldMin; span > 0 {
		holdFor += time.Duration(w.rng.Int64N(int64(span)))
	}
	writes := 1 + w.rng.IntN(3)
	for i := range writes {
		now := mono()
		vu := validUntil(now, l)
		if vu <= now {
			break // the lease ended or ran out: a careful holder stops writing
		}
		ev := w.event(KindValid, l.Name())
		ev.Mono, ev.Token, ev.ValidUntil = now, l.Token(), vu
		w.em.emit(ev)
		if err := w.res.write(l.Name(), l.Token(), w.g, w.op, vu); err != nil {
			ev := w.event(KindPanic, l.Name())
			ev.Err = "fenced resource: " + err.Error()
			w.em.emit(ev)
			break
		}
		if i < writes-1 {
			pause(ctx, holdFor/time.Duration(writes))
		}
	}
	// Done closing from here on is the Unlock's doing (or too late to
	// matter: the holder has stopped believing it holds the lock).
	stop()
	w.em.emit(w.event(KindUnlockStart, l.Name()))
	err := l.Unlock(context.Background())
	end := w.event(KindUnlockEnd, l.Name())
	end.Token = l.Token()
	if err != nil {
		end.Err = err.Error()
	}
	w.em.emit(end)
}

// validUntil is the lease's validity deadline on the Mono clock, read
// conservatively: now was read before ValidFor, so the result never lies
// past the lease's real deadline. now when the lease has ended.
func validUntil(now int64, l *dlock.Lease) int64 {
	return now + int64(l.ValidFor())
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// resourceConn is a worker goroutine's connection to the fenced resource.
type resourceConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialResource(addr string, worker int) (*resourceConn, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	rc := &resourceConn{conn: conn, r: bufio.NewReader(conn)}
	if _, err := fmt.Fprintf(conn, "worker %d\n", worker); err != nil {
		conn.Close()
		return nil, err
	}
	return rc, nil
}

// write sends one fenced write and waits for the resource's answer.
func (rc *resourceConn) write(lock string, token uint64, g int, op int64, validUntil int64) error {
	if _, err := fmt.Fprintf(rc.conn, "%s\t%d\t%d\t%d\t%d\n", lock, token, g, op, validUntil); err != nil {
		return err
	}
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return err
	}
	switch strings.TrimSpace(line) {
	case "1", "0":
		return nil
	}
	return errors.New("unexpected answer " + strconv.Quote(line))
}

func (rc *resourceConn) Close() error { return rc.conn.Close() }
