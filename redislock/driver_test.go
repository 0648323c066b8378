package redislock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// fixture is one redis-server, an admin client, and a driver over a
// user-style client (with ContextTimeoutEnabled).
type fixture struct {
	srv   *testserver.Server
	admin *redis.Client
	d     *Driver
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	admin := redis.NewClient(opt)
	t.Cleanup(func() { _ = admin.Close() })
	d, err := New(admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return &fixture{srv: srv, admin: admin, d: d}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func lease(req driver.AcquireRequest, g driver.Grant) driver.Lease {
	return driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL, LockDelay: req.LockDelay}
}

// grantAndRelease takes req on f's driver and releases it.
func (f *fixture) grantAndRelease(t *testing.T, ctx context.Context, req driver.AcquireRequest) {
	t.Helper()
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatal(err)
	}
}

func TestGrantReenterRelease(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "a{b}c", Owner: "o1", TTL: 5 * time.Second}
	g1, err := f.d.TryAcquire(ctx, req)
	if err != nil || g1.Count != 1 || g1.Token == 0 {
		t.Fatalf("first grant: %+v, %v", g1, err)
	}
	g2, err := f.d.TryAcquire(ctx, req)
	if err != nil || g2.Count != 2 || g2.Token != g1.Token {
		t.Fatalf("re-enter: %+v, %v (first token %d)", g2, err, g1.Token)
	}
	other := req
	other.Owner = "o2"
	_, err = f.d.TryAcquire(ctx, other)
	var le *driver.LockedError
	if !errors.As(err, &le) || le.Token != g1.Token || le.RetryAfter <= 4*time.Second || le.RetryAfter > 5*time.Second {
		t.Fatalf("other owner: %v (%+v), want LockedError with token %d and RetryAfter ≈ 5s", err, le, g1.Token)
	}
	if n, err := f.d.Release(ctx, lease(other, g1)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release by another owner: %d, %v; want ErrNotHeld", n, err)
	}
	stale := lease(req, g1)
	stale.Token = g1.Token + 1
	if _, err := f.d.Release(ctx, stale); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release with another grant's token: %v; want ErrNotHeld", err)
	}
	if n, err := f.d.Release(ctx, lease(req, g1)); err != nil || n != 1 {
		t.Fatalf("first release: %d, %v; want 1 hold left", n, err)
	}
	if n, err := f.d.Release(ctx, lease(req, g1)); err != nil || n != 0 {
		t.Fatalf("last release: %d, %v; want 0", n, err)
	}
	if n, err := f.d.Release(ctx, lease(req, g1)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release after the last: %d, %v; want ErrNotHeld", n, err)
	}
	g3, err := f.d.TryAcquire(ctx, other)
	if err != nil || g3.Token <= g1.Token {
		t.Fatalf("grant after release: %+v, %v; want token > %d", g3, err, g1.Token)
	}
	// The braces in the name did not leak into the key layout.
	keys, err := f.admin.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key %q has extra braces", k)
		}
	}
}

func TestLockDelayAfterExpiry(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "delayed", Owner: "o1", TTL: 5 * time.Second, LockDelay: 400 * time.Millisecond}
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := redisscript.Drop(ctx, f.admin, redisscript.KeysFor(DefaultKeyPrefix, req.Name)); err != nil {
		t.Fatal(err)
	}
	dropped := time.Now()
	// Expired: the holder can neither renew, re-enter nor release...
	errs, err := f.d.Renew(ctx, []driver.Lease{lease(req, g)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("renew after expiry: %v, %v; want ErrNotHeld", errs, err)
	}
	if _, err := f.d.TryAcquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("re-enter after expiry: %v; want ErrLocked", err)
	}
	if _, err := f.d.Release(ctx, lease(req, g)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release after expiry: %v; want ErrNotHeld", err)
	}
	// ...and nobody else can take it until the delay is over.
	other := driver.AcquireRequest{Name: req.Name, Owner: "o2", TTL: time.Second}
	_, err = f.d.TryAcquire(ctx, other)
	var le *driver.LockedError
	if !errors.As(err, &le) || le.RetryAfter <= 0 || le.RetryAfter > 400*time.Millisecond {
		t.Fatalf("during lock-delay: %v (%+v); want LockedError with RetryAfter ≤ 400ms", err, le)
	}
	for {
		g2, err := f.d.TryAcquire(ctx, other)
		if err == nil {
			if since := time.Since(dropped); since < 350*time.Millisecond {
				t.Fatalf("granted %v after expiry, inside the 400ms lock-delay", since)
			}
			if g2.Token <= g.Token {
				t.Fatalf("token %d after a crashed holder's %d", g2.Token, g.Token)
			}
			break
		}
		if !errors.Is(err, driver.ErrLocked) {
			t.Fatal(err)
		}
		if time.Since(dropped) > 3*time.Second {
			t.Fatal("still locked 3s after a 400ms lock-delay")
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not waiting for one
	}
}

func TestCleanReleaseSkipsLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "clean", Owner: "o1", TTL: 5 * time.Second, LockDelay: time.Minute}
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.TryAcquire(ctx, driver.AcquireRequest{Name: req.Name, Owner: "o2", TTL: time.Second}); err != nil {
		t.Fatalf("after a clean release: %v; want a grant at once", err)
	}
}

// countHook counts the round trips a go-redis client makes.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

func TestRenewManyInOneRoundTrip(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	const n = 10000
	ls := make([]driver.Lease, 0, n)
	pipe := f.admin.Pipeline()
	for i := 0; i < n; i++ {
		// Take the locks in bulk, in the scripts' format (count, token,
		// no lock-delay, owner), in one pipeline.
		k := redisscript.KeysFor(DefaultKeyPrefix, fmt.Sprintf("many-%d", i))
		pipe.Set(ctx, k.Lock, "1\n1\n\n\no", 2*time.Second)
		ls = append(ls, driver.Lease{Name: fmt.Sprintf("many-%d", i), Owner: "o", Token: 1, TTL: 20 * time.Second})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// A stale lease among them is reported alone.
	ls[17].Owner = "someone-else"
	// Start with an empty script cache: the flush costs one extra round trip.
	if err := f.admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	hook := &countHook{}
	f.admin.AddHook(hook)
	for round := 0; round < 2; round++ {
		before := hook.n.Load()
		errs, err := f.d.Renew(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		trips := hook.n.Load() - before
		limit := int64(1)
		if round == 0 {
			limit = 3 // pipeline, SCRIPT LOAD, pipeline again
		}
		if trips > limit {
			t.Errorf("round %d: renewing %d leases took %d round trips, want ≤ %d", round, n, trips, limit)
		}
		for i, e := range errs {
			if i == 17 {
				if !errors.Is(e, driver.ErrNotHeld) {
					t.Errorf("stale lease: %v, want ErrNotHeld", e)
				}
				continue
			}
			if e != nil {
				t.Fatalf("lease %d: %v", i, e)
			}
		}
	}
	if ttl := f.admin.PTTL(ctx, redisscript.KeysFor(DefaultKeyPrefix, "many-9999").Lock).Val(); ttl < 10*time.Second {
		t.Errorf("PTTL after renew = %v, want ≈ 20s", ttl)
	}
}

func TestScriptCacheFlushed(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "flush", Owner: "o1", TTL: 5 * time.Second}
	if err := f.admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("acquire after SCRIPT FLUSH: %v", err)
	}
	if err := f.admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatalf("release after SCRIPT FLUSH: %v", err)
	}
}

// TestWakeOne: a release wakes the oldest waiter of a driver, not all of
// them; a waiter that leaves with its wake-up unconsumed passes it on.
func TestWakeOne(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "wake", Owner: "holder", TTL: 10 * time.Second}
	var subs []driver.Subscription
	for i := 0; i < 3; i++ {
		s, err := f.d.Subscribe(ctx, req.Name)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs = append(subs, s)
		if i == 0 {
			// The server's confirmation of the channel's subscription
			// wakes the waiters registered before it, once.
			select {
			case <-s.C():
			case <-time.After(5 * time.Second):
				t.Fatal("no wake-up on subscription confirmation")
			}
		}
	}
	release := func() { f.grantAndRelease(t, ctx, req) }
	release()
	select {
	case <-subs[0].C():
	case <-time.After(5 * time.Second):
		t.Fatal("oldest waiter not woken by a release")
	}
	// Waiter 0 consumed its wake-up, so the second release wakes it again,
	// and nobody else.
	release()
	select {
	case <-subs[0].C():
	case <-time.After(5 * time.Second):
		t.Fatal("oldest waiter not woken by the second release")
	}
	for i, s := range subs[1:] {
		select {
		case <-s.C():
			t.Fatalf("waiter %d woken too; a release should wake one waiter per driver", i+1)
		default:
		}
	}
	// Waiter 0 gets a wake-up and leaves without consuming it: waiter 1
	// inherits it.
	release()
	testwait.Until(t, 5*time.Second, "the third release to reach waiter 0", func() bool { return len(subs[0].C()) > 0 })
	_ = subs[0].Close()
	select {
	case <-subs[1].C():
	case <-time.After(time.Second):
		t.Fatal("wake-up not passed on by a waiter that left")
	}
	if len(subs[2].C()) != 0 {
		t.Fatal("waiter 2 woken too")
	}
}

// TestSubscribeSurvivesServerRestart: waiters are woken when the pub/sub
// connection drops (releases may have been missed), and notifications work
// again once the server is back.
func TestSubscribeSurvivesServerRestart(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	s, err := f.d.Subscribe(ctx, "restart")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	<-s.C() // confirmation
	if err := f.srv.Restart(true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.C():
	case <-time.After(10 * time.Second):
		t.Fatal("no wake-up after the server restarted")
	}
	req := driver.AcquireRequest{Name: "restart", Owner: "o", TTL: 5 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Drain wake-ups from reconnecting, then a release must arrive.
		for len(s.C()) > 0 {
			<-s.C()
		}
		g, err := f.d.TryAcquire(ctx, req)
		if err == nil {
			_, err = f.d.Release(ctx, lease(req, g))
		}
		if err == nil {
			select {
			case <-s.C():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no release notification after the restart (last error %v)", err)
		}
	}
}

func TestCloseKeepsUserClient(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	s, err := f.d.Subscribe(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := f.d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := f.admin.Ping(ctx).Err(); err != nil {
		t.Fatalf("the user's client was closed by the driver: %v", err)
	}
	if _, err := f.d.Subscribe(ctx, "x"); err == nil {
		t.Fatal("Subscribe after Close succeeded")
	}
}

func TestInspect(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	for _, n := range []string{"app/{1}", "app/2", "other"} {
		if _, err := f.d.TryAcquire(ctx, driver.AcquireRequest{Name: n, Owner: "o-" + n, TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	g, _ := f.d.TryAcquire(ctx, driver.AcquireRequest{Name: "app/free", Owner: "x", TTL: 10 * time.Second})
	if _, err := f.d.Release(ctx, driver.Lease{Name: "app/free", Owner: "x", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	infos, err := f.d.Inspect(ctx, "app/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("Inspect = %+v, want app/2, app/free, app/{1}", infos)
	}
	want := []string{"app/2", "app/free", "app/{1}"}
	for i, in := range infos {
		if in.Name != want[i] {
			t.Fatalf("Inspect[%d].Name = %q, want %q", i, in.Name, want[i])
		}
		if in.Name == "app/free" {
			if in.Owner != "" || in.Count != 0 || in.Token == 0 {
				t.Errorf("free lock: %+v", in)
			}
			continue
		}
		if in.Owner != "o-"+in.Name || in.Count != 1 || in.Token == 0 || in.ExpiresIn <= 0 || in.Waiters != 0 {
			t.Errorf("held lock: %+v", in)
		}
	}
}

func TestURL(t *testing.T) {
	srv := testserver.Redis(t, nil)
	ctx := ctxT(t)
	base, _ := url.Parse(srv.URL())
	open := func(raw string) (driver.Driver, error) {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return OpenURL(ctx, u)
	}
	d, err := open(srv.URL() + "?key_prefix=app1:&pool_size=4")
	if err != nil {
		t.Fatalf("valid URL: %v", err)
	}
	if d.(*Driver).prefix != "app1:" {
		t.Errorf("prefix = %q", d.(*Driver).prefix)
	}
	_ = d.Close()

	// Bad input wraps driver.ErrInvalid (dlock.Open reports it as an
	// invalid URL, the CLI exits 64); an unreachable server does not.
	for _, tc := range []struct {
		url, want string
		invalid   bool
	}{
		{srv.URL() + "?bogus=1", "bogus", true},
		{srv.URL() + "?key_prefix=a{b", "KeyPrefix", true},
		{srv.URL() + "?key_prefix=", "key_prefix", true},
		{"redis://user:s3cr3t-pw@" + base.Host + "/0?pool_size=x", "pool_size", true},
		{"redis://user:s3cr3t-pw@127.0.0.1:1/0", "cannot reach", false},
		{"redis://user:s3cr3t-pw@" + base.Host + "/zero", "database", true},
	} {
		d, err := open(tc.url)
		if err == nil {
			_ = d.Close()
			t.Errorf("%s: no error", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not mention %q", tc.url, err, tc.want)
		}
		if got := errors.Is(err, driver.ErrInvalid); got != tc.invalid {
			t.Errorf("%s: error %q: wraps driver.ErrInvalid = %v, want %v", tc.url, err, got, tc.invalid)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error %q shows the password", tc.url, err)
		}
	}

	// A wrong password is refused without echoing it.
	cfg := redis.NewClient(&redis.Options{Addr: base.Host})
	err = cfg.ConfigSet(ctx, "requirepass", "right-pw").Err()
	_ = cfg.Close()
	if err != nil {
		t.Fatal(err)
	}
	_, err = dlock.Open(ctx, "redis://:wr0ng-pw@"+base.Host+"/0")
	if err == nil || strings.Contains(err.Error(), "wr0ng-pw") {
		t.Fatalf("wrong password: %v", err)
	}
	c, err := dlock.Open(ctx, "redis://:right-pw@"+base.Host+"/0?ttl=2s")
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	l, err := c.NewMutex("through-open", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	_ = c.Close()

	// rediss:// turns TLS on.
	opt, _, err := parseURL(&url.URL{Scheme: "rediss", Host: "example.com:6380"})
	if err != nil || opt.TLSConfig == nil || opt.TLSConfig.ServerName != "example.com" {
		t.Fatalf("rediss: %+v, %v", opt, err)
	}
}

func TestCloseClosesURLClient(t *testing.T) {
	srv := testserver.Redis(t, nil)
	ctx := ctxT(t)
	u, _ := url.Parse(srv.URL())
	dd, err := OpenURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	d := dd.(*Driver)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.client.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("client opened from the URL still usable after Close: %v", err)
	}
}
