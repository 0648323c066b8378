package redislock

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/locktest"
)

// plainHarness is the conformance harness with layout=plain: every lock
// lives at its name's own key.
type plainHarness struct{ *harness }

func newPlainHarness(ctx context.Context, t testing.TB) (locktest.Harness, error) {
	h, err := newHarness(ctx, t)
	if err != nil {
		return nil, err
	}
	return plainHarness{h.(*harness)}, nil
}

func (h plainHarness) NewDriver(ctx context.Context) (driver.Driver, error) {
	u, err := url.Parse(h.srv.URL() + "?layout=plain")
	if err != nil {
		return nil, err
	}
	return OpenURL(ctx, u)
}

func (h plainHarness) Drop(ctx context.Context, name string) error {
	k, err := redisscript.PlainKeysFor(name)
	if err != nil {
		return err
	}
	_, err = redisscript.Drop(ctx, h.admin, k)
	return err
}

// TestConformancePlain runs the conformance suite with layout=plain
// (mutexes; the other kinds are refused with ErrUnsupported).
func TestConformancePlain(t *testing.T) { locktest.RunConformanceTests(t, newPlainHarness) }

func plainDriver(t *testing.T, c redis.UniversalClient) *Driver {
	t.Helper()
	d, err := New(c, &Options{Layout: LayoutPlain})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestPlainLayoutKeys: the lock is the name's own key, in dlock's value
// format; its counter and channel are beside it in its hash slot; a release
// deletes the key and publishes on the channel.
func TestPlainLayoutKeys(t *testing.T) {
	f := newFixture(t)
	d := plainDriver(t, f.admin)
	ctx := ctxT(t)
	sub := f.admin.Subscribe(ctx, "{orders:1}:rel")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "orders:1", Owner: "o", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	v, err := f.admin.Get(ctx, "orders:1").Result()
	if err != nil {
		t.Fatalf("GET orders:1: %v (the lock must be at the name's own key)", err)
	}
	if _, tok, owner, ok := redisscript.ParseValue(v); !ok || tok != g.Token || owner != "o" {
		t.Fatalf("orders:1 holds %q, want dlock's value with token %d", v, g.Token)
	}
	if n, err := f.admin.Get(ctx, "{orders:1}:fence").Uint64(); err != nil || n != g.Token {
		t.Fatalf("{orders:1}:fence = %d, %v; want %d", n, err, g.Token)
	}
	if g.Key != "orders:1" {
		t.Fatalf("Grant.Key = %q, want orders:1", g.Key)
	}
	if _, err := d.Release(ctx, queuetest.Lease("orders:1", "o", g)); err != nil {
		t.Fatal(err)
	}
	if n := f.admin.Exists(ctx, "orders:1").Val(); n != 0 {
		t.Fatal("release left the key")
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil || msg.Payload != "1" {
		t.Fatalf("release published %v, %v; want the token 1", msg, err)
	}
	// A key with a hash tag keeps its companions under that tag.
	g, err = d.TryAcquire(ctx, driver.AcquireRequest{Name: "{user:7}:lock", Owner: "o", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.admin.Get(ctx, "{user:7}:lock:fence").Uint64(); err != nil || n != g.Token {
		t.Fatalf("{user:7}:lock:fence = %d, %v; want %d", n, err, g.Token)
	}
	infos, err := d.Inspect(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Name != "orders:1" || infos[0].Owner != "" || infos[1].Name != "{user:7}:lock" || infos[1].Owner != "o" {
		t.Fatalf("Inspect = %+v; want orders:1 free and {user:7}:lock held by o", infos)
	}
}

// TestPlainLayoutRefuses: a name whose braces form no hash tag, and the
// read/write lock and semaphore kinds, are refused in the plain layout; an
// unknown layout is refused.
func TestPlainLayoutRefuses(t *testing.T) {
	f := newFixture(t)
	d := plainDriver(t, f.admin)
	ctx := ctxT(t)
	if err := d.CheckName("a}b"); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("CheckName(a}b) = %v, want ErrInvalid", err)
	}
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "a}b", Owner: "o", TTL: time.Second}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("TryAcquire(a}b) = %v, want ErrInvalid", err)
	}
	for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
		if d.SupportsKind(k) {
			t.Errorf("SupportsKind(%v) in layout=plain", k)
		}
		if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "k", Owner: "o", TTL: time.Second, Kind: k, Permits: 2}); !errors.Is(err, driver.ErrUnsupported) {
			t.Errorf("TryAcquire of a %v lock = %v, want ErrUnsupported", k, err)
		}
	}
	if _, err := New(f.admin, &Options{Layout: "flat"}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New with layout flat: %v, want ErrInvalid", err)
	}
	u, _ := url.Parse(f.srv.URL() + "?layout=flat")
	if _, err := OpenURL(ctx, u); err == nil || !strings.Contains(err.Error(), "layout") {
		t.Fatalf("OpenURL with layout=flat: %v, want an error naming layout", err)
	}
}

// scriptHook counts the script calls (EVALSHA, EVAL) a client makes.
type scriptHook struct{ n atomic.Int64 }

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestPlainForeignHolderPolled: a foreign client's key publishes nothing
// when it goes, so a waiter looks again every 20-250ms while a key dlock did
// not write holds the lock (not every second, as for a dlock holder, whose
// release wakes it), and gets the lock soon after the key is deleted.
func TestPlainForeignHolderPolled(t *testing.T) {
	f := newFixture(t)
	c := redis.NewClient(&redis.Options{Addr: f.srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	hook := &scriptHook{}
	c.AddHook(hook)
	d := plainDriver(t, c)
	ctx := ctxT(t)
	if err := f.admin.Set(ctx, "foreign", "a redsync token", 0).Err(); err != nil {
		t.Fatal(err)
	}
	type res struct {
		g   driver.Grant
		err error
		at  time.Time
	}
	ch := make(chan res, 1)
	go func() {
		g, err := d.Acquire(ctx, driver.AcquireRequest{Name: "foreign", Owner: "o", TTL: 5 * time.Second})
		ch <- res{g, err, time.Now()}
	}()
	queuetest.Eventually(t, 10*time.Second, "waiter queued", func() bool { return f.admin.ZCard(ctx, "{foreign}:q").Val() == 1 })
	before := hook.n.Load()
	select {
	case r := <-ch:
		t.Fatalf("granted while a foreign key holds the lock: %v", r.err)
	case <-time.After(1500 * time.Millisecond): // the foreign hold
	}
	if n := hook.n.Load() - before; n < 5 {
		t.Fatalf("the waiter tried %d times in 1.5s of a foreign hold, want at least 5 (polled at most every 250ms)", n)
	}
	deleted := time.Now()
	if err := f.admin.Del(ctx, "foreign").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("granted %v after the foreign key's deletion", r.at.Sub(deleted).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("not granted after the foreign key's deletion")
	}
}
