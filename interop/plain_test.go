package interop

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/redislock"
)

// foreign is a SET NX PX + compare-and-delete lock client on one key.
type foreign interface {
	// try takes the lock without waiting.
	try(t *testing.T, ttl time.Duration) bool
	// lock starts a waiting acquire; the channel delivers when it holds.
	lock(t *testing.T, ttl time.Duration) <-chan time.Time
	// unlock releases what try or lock took.
	unlock(t *testing.T)
}

// redsyncLock is redsync's Mutex (retrying every 20–60 ms while it waits).
type redsyncLock struct {
	rs  *redsync.Redsync
	key string
	m   *redsync.Mutex
}

func (r *redsyncLock) try(t *testing.T, ttl time.Duration) bool {
	m := r.rs.NewMutex(r.key, redsync.WithExpiry(ttl))
	if err := m.TryLock(); err != nil {
		return false
	}
	r.m = m
	return true
}

func (r *redsyncLock) lock(t *testing.T, ttl time.Duration) <-chan time.Time {
	m := r.rs.NewMutex(r.key, redsync.WithExpiry(ttl), redsync.WithTries(1000),
		redsync.WithRetryDelayFunc(func(int) time.Duration { return 20 * time.Millisecond }))
	ch := make(chan time.Time, 1)
	go func() {
		if err := m.Lock(); err != nil {
			t.Errorf("redsync Lock: %v", err)
			return
		}
		r.m = m
		ch <- time.Now()
	}()
	return ch
}

func (r *redsyncLock) unlock(t *testing.T) {
	if ok, err := r.m.Unlock(); !ok || err != nil {
		t.Fatalf("redsync Unlock: %v, %v", ok, err)
	}
}

// bsmLock is bsm/redislock's Obtain (retrying every 20 ms while it waits).
type bsmLock struct {
	c   *bsm.Client
	key string
	l   *bsm.Lock
}

func (b *bsmLock) try(t *testing.T, ttl time.Duration) bool {
	l, err := b.c.Obtain(context.Background(), b.key, ttl, nil)
	if errors.Is(err, bsm.ErrNotObtained) {
		return false
	}
	if err != nil {
		t.Fatalf("bsm Obtain: %v", err)
	}
	b.l = l
	return true
}

func (b *bsmLock) lock(t *testing.T, ttl time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := b.c.Obtain(ctx, b.key, ttl, &bsm.Options{RetryStrategy: bsm.LinearBackoff(20 * time.Millisecond)})
		if err != nil {
			t.Errorf("bsm Obtain: %v", err)
			return
		}
		b.l = l
		ch <- time.Now()
	}()
	return ch
}

func (b *bsmLock) unlock(t *testing.T) {
	if err := b.l.Release(context.Background()); err != nil {
		t.Fatalf("bsm Release: %v", err)
	}
}

// redisPyLock is redis-py's Lock in a Python process (polling every 50 ms
// while it waits).
type redisPyLock struct {
	p   *peer
	key string
	n   int
}

func (r *redisPyLock) try(t *testing.T, ttl time.Duration) bool {
	r.n++
	r.p.send("try t%d %s %d", r.n, r.key, ttl.Milliseconds())
	l, _ := r.p.expectPrefix(r.id(), 10*time.Second)
	return l == r.id()+" got"
}

func (r *redisPyLock) id() string { return "t" + strconv.Itoa(r.n) }

func (r *redisPyLock) lock(t *testing.T, ttl time.Duration) <-chan time.Time {
	r.n++
	r.p.send("lock t%d %s %d", r.n, r.key, ttl.Milliseconds())
	r.p.expect(r.id()+" waiting", 10*time.Second)
	ch := make(chan time.Time, 1)
	id := r.id()
	go func() {
		if _, at, ok := r.p.waitPrefix(id+" locked", 30*time.Second); ok {
			ch <- at
		}
	}()
	return ch
}

func (r *redisPyLock) unlock(t *testing.T) {
	r.p.send("release %s", r.id())
	r.p.expect(r.id()+" released", 10*time.Second)
}

// TestPlainLayout: with layout=plain the lock lives at the user's key, so
// dlock and redis-py's Lock, redsync and bsm/redislock exclude one another
// both ways; a waiter in either gets the lock within a second of the
// other's release; a lock whose holder crashed goes to the other's waiter
// when it expires by its own rules (the foreign client's PX; dlock's TTL
// plus lock-delay); dlock's tokens keep rising across foreign holds.
func TestPlainLayout(t *testing.T) {
	srv := testserver.Redis(t, nil)
	url := "redis://" + srv.Addr()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rc.Close() })
	py := startPython(t, "redis-py", "redispy_lock.py", url)
	clients := map[string]func(key string) foreign{
		"redis-py": func(key string) foreign { return &redisPyLock{p: py, key: key} },
		"redsync":  func(key string) foreign { return &redsyncLock{rs: redsync.New(goredis.NewPool(rc)), key: key} },
		"bsm":      func(key string) foreign { return &bsmLock{c: bsm.New(rc), key: key} },
	}
	c := openDlock(t, url+"?layout=plain&ttl=2s")
	for _, name := range []string{"redis-py", "redsync", "bsm"} {
		t.Run(name, func(t *testing.T) {
			py.use(t)
			ctx := ctxFor(t, 60*time.Second)
			key := "plain:" + name
			f := clients[name](key)
			m := c.NewMutex(key, nil)

			// dlock first, so that its counter exists beside the key.
			l0, err := m.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l0.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			// The foreign client holds: dlock's try fails, status shows
			// the lock held, and dlock's waiter gets it at once when the
			// foreign client lets go.
			if !f.try(t, 10*time.Second) {
				t.Fatalf("%s could not take a free lock", name)
			}
			if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
				t.Fatalf("dlock TryLock while %s holds: %v, want ErrLocked", name, err)
			}
			infos, err := c.Inspect(ctx, key)
			if err != nil || len(infos) != 1 || infos[0].Name != key || infos[0].Owner == "" {
				t.Fatalf("Inspect while %s holds: %+v, %v; want %q held", name, infos, err, key)
			}
			t.Logf("%s's hold in status: %+v", name, infos[0])
			ch := locking(ctx, m)
			notYet(t, ch, 300*time.Millisecond, "dlock Lock")
			released := time.Now()
			f.unlock(t)
			r := await(t, ch, 10*time.Second, "dlock behind "+name)
			checkHandOver(t, name+" → dlock", released, r.at)
			if r.l.Token() <= l0.Token() {
				t.Fatalf("dlock's token %d after %s's hold is not above its earlier %d", r.l.Token(), name, l0.Token())
			}

			// dlock holds: the foreign try fails; its waiter gets the lock
			// when dlock releases.
			if f.try(t, 10*time.Second) {
				t.Fatalf("%s took the lock dlock holds", name)
			}
			fch := f.lock(t, 10*time.Second)
			select {
			case <-fch:
				t.Fatalf("%s got the lock dlock holds", name)
			case <-time.After(300 * time.Millisecond):
			}
			released = time.Now()
			if err := r.l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case at := <-fch:
				checkHandOver(t, "dlock → "+name, released, at)
			case <-time.After(10 * time.Second):
				t.Fatalf("%s did not get the lock dlock released", name)
			}
			f.unlock(t)

			// A crashed foreign holder (it never releases): its key
			// expires by its PX, and dlock's waiter gets the lock then.
			if !f.try(t, time.Second) {
				t.Fatalf("%s could not take a free lock", name)
			}
			took := time.Now()
			r = await(t, locking(ctx, m), 10*time.Second, "dlock behind a crashed "+name)
			t.Logf("crashed %s's lock (PX 1s) went to dlock after %v", name, r.at.Sub(took).Round(time.Millisecond))
			if err := r.l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			// A crashed dlock holder (never renewed nor released): its key
			// lives TTL + lock-delay, then the foreign waiter gets it.
			d, err := redislock.New(rc, &redislock.Options{Layout: redislock.LayoutPlain})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: key, Owner: "crashed", TTL: time.Second, LockDelay: 500 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			took = time.Now()
			select {
			case at := <-f.lock(t, 10*time.Second):
				if at.Sub(took) < 1500*time.Millisecond {
					t.Fatalf("%s got the lock %v after dlock's grant, before its TTL and lock-delay ran out", name, at.Sub(took))
				}
				t.Logf("crashed dlock's lock (TTL 1s + lock-delay 0.5s) went to %s after %v", name, at.Sub(took).Round(time.Millisecond))
			case <-time.After(20 * time.Second):
				t.Fatalf("%s did not get the lock of a crashed dlock", name)
			}
			f.unlock(t)
			d.Close()
		})
	}
}
