package interop

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/redislock"
)

// handOver bounds how long a waiter may take to get a lock its holder in
// another client released: a release wakes the waiter at once, so this is
// generous.
const handOver = time.Second

func checkHandOver(t *testing.T, what string, released, granted time.Time) {
	t.Helper()
	took := granted.Sub(released)
	t.Logf("hand-over %s: %v", what, took.Round(time.Millisecond))
	if took > handOver {
		t.Fatalf("hand-over %s took %v, want at most %v", what, took, handOver)
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func openDlock(t *testing.T, url string) *dlock.Client {
	t.Helper()
	c, err := dlock.Open(ctxFor(t, 20*time.Second), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// token reads the number in a peer's "ID got N" or "ID locked N" line.
func tokenOf(t *testing.T, p *peer, prefix string, within time.Duration) (uint64, time.Time) {
	t.Helper()
	l, at := p.expectPrefix(prefix, within)
	n, err := strconv.ParseUint(strings.TrimPrefix(l, prefix), 10, 64)
	if err != nil {
		t.Fatalf("%s said %q: no token", p.name, l)
	}
	return n, at
}

type locked struct {
	l   *dlock.Lease
	err error
	at  time.Time
}

func locking(ctx context.Context, m *dlock.Mutex) <-chan locked {
	ch := make(chan locked, 1)
	go func() {
		l, err := m.Lock(ctx)
		ch <- locked{l, err, time.Now()}
	}()
	return ch
}

func await(t *testing.T, ch <-chan locked, within time.Duration, what string) locked {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r
	case <-time.After(within):
		t.Fatalf("%s: not granted within %v", what, within)
	}
	panic("unreachable")
}

func notYet(t *testing.T, ch <-chan locked, d time.Duration, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s granted while the other client holds it (err %v)", what, r.err)
	case <-time.After(d):
	}
}

// TestPythonClientOfDlockLayout runs testdata/dlock_redis.py, a client of
// dlock's own Redis layout written from docs/protocol.md (its own scripts,
// keys, value format, queue and channel), against dlock: each excludes the
// other, a waiter in either is woken by the other's release within a
// second, tokens keep rising across both, and a crashed holder's lock is
// freed by its TTL (plus lock-delay).
func TestPythonClientOfDlockLayout(t *testing.T) {
	srv := testserver.Redis(t, nil)
	url := "redis://" + srv.Addr()
	c := openDlock(t, url+"?ttl=2s")
	py := startPython(t, "dlock_redis.py", "dlock_redis.py", url)
	ctx := ctxFor(t, 60*time.Second)
	const name = "py/orders{7}" // braces: the name is base64-encoded in its keys
	m := c.NewMutex(name, nil)

	// Python holds: dlock's try fails, and its waiter gets the lock when
	// Python releases, with a larger token.
	py.send("try a %s P1 5000", name)
	t1, _ := tokenOf(t, py, "a got ", 10*time.Second)
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("dlock TryLock while Python holds: %v, want ErrLocked", err)
	}
	infos, err := c.Inspect(ctx, "py/")
	if err != nil || len(infos) != 1 || infos[0].Owner != "P1" || infos[0].Token != t1 {
		t.Fatalf("Inspect while Python holds: %+v, %v; want P1 with token %d", infos, err, t1)
	}
	ch := locking(ctx, m)
	notYet(t, ch, 300*time.Millisecond, "dlock Lock")
	py.send("release a")
	released := py.expect("a released", 10*time.Second)
	r := await(t, ch, 10*time.Second, "dlock behind Python")
	checkHandOver(t, "Python → dlock", released, r.at)
	if r.l.Token() <= t1 {
		t.Fatalf("dlock's token %d is not above Python's %d", r.l.Token(), t1)
	}

	// dlock holds: Python's try fails; its waiter (queued in dlock's
	// queue) is woken by dlock's release and continues the tokens.
	py.send("try b %s P2 5000", name)
	py.expect("b busy", 10*time.Second)
	py.send("lock b %s P2 5000", name)
	py.expect("b waiting", 10*time.Second)
	py.quiet("b", 300*time.Millisecond)
	released = time.Now()
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	t2, at := tokenOf(t, py, "b locked ", 10*time.Second)
	checkHandOver(t, "dlock → Python", released, at)
	if t2 <= r.l.Token() {
		t.Fatalf("Python's token %d is not above dlock's %d", t2, r.l.Token())
	}
	// Python's waiter queued in dlock's queue: a dlock TryLock now goes
	// behind nobody, but the lock is held.
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("dlock TryLock while Python's waiter holds: %v, want ErrLocked", err)
	}
	py.send("release b")
	py.expect("b released", 10*time.Second)
}

// TestPythonClientCrash: a crashed holder's lock is freed by its own expiry
// both ways. A killed Python holder's key expires after its TTL and a
// waiting dlock gets it; a dlock holder that stops renewing (a crash)
// loses its key after its TTL and lock-delay, and Python's waiter gets it.
func TestPythonClientCrash(t *testing.T) {
	srv := testserver.Redis(t, nil)
	url := "redis://" + srv.Addr()
	c := openDlock(t, url+"?ttl=2s")
	ctx := ctxFor(t, 60*time.Second)
	const name = "py/crash"

	py := startPython(t, "dlock_redis.py", "dlock_redis.py", url)
	py.send("try a %s P1 1000", name)
	tokenOf(t, py, "a got ", 10*time.Second)
	ch := locking(ctx, c.NewMutex(name, nil))
	if err := py.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	r := await(t, ch, 10*time.Second, "dlock behind a killed Python")
	t.Logf("killed Python's lock went to dlock after %v (TTL 1s)", r.at.Sub(killed).Round(time.Millisecond))
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A dlock holder that crashes: its driver takes the lock and is never
	// asked to renew or release it.
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rc.Close() })
	d, err := redislock.New(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "crashed", TTL: time.Second, LockDelay: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	py = startPython(t, "dlock_redis.py", "dlock_redis.py", url)
	py.send("lock b %s P2 5000", name)
	py.expect("b waiting", 10*time.Second)
	_, at := tokenOf(t, py, "b locked ", 10*time.Second)
	if took := at.Sub(crashed); took < time.Second+500*time.Millisecond {
		t.Fatalf("Python got the lock %v after dlock's grant, before its TTL and lock-delay ran out", took)
	}
	t.Logf("crashed dlock's lock went to Python after %v (TTL 1s + lock-delay 0.5s)", at.Sub(crashed).Round(time.Millisecond))
	py.send("release b")
	py.expect("b released", 10*time.Second)
	d.Close()
}
