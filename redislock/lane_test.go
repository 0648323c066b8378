package redislock

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisinfo"
	"github.com/dlock/dlock/internal/redislane"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestLaneSkipsPool: back-to-back grants and releases of a driver over a
// *redis.Client use the driver's own connection, not go-redis's pool (whose
// Get checks the connection with a system call each time). Before the lane,
// each pair took two connections from the pool.
func TestLaneSkipsPool(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "lane", Owner: "o", TTL: time.Minute}
	pair := func() { f.grantAndRelease(t, ctx, req) }
	pair()
	st := f.admin.PoolStats()
	before := st.Hits + st.Misses
	const pairs = 50
	for range pairs {
		pair()
	}
	st = f.admin.PoolStats()
	// A pause longer than redislane.Idle (a slow machine) sends one pair back
	// to the pool; the pool would serve all 2*pairs calls.
	if gets := st.Hits + st.Misses - before; gets > pairs/5 {
		t.Fatalf("%d pairs took %d connections from the pool; want (almost) none", pairs, gets)
	}
}

// TestLaneIdleGoesThroughPool: a call that comes more than redislane.Idle after
// the previous one uses the pool, whose check finds a connection the server
// closed meanwhile (the lane's included): the call succeeds, and the lane
// gave its connection back.
func TestLaneIdleGoesThroughPool(t *testing.T) {
	f, ctx, req, g := grantOnLaneThenKill(t, "lane-idle")
	f.d.lane.SetLastCall(time.Hour) // the last call began an hour ago
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatalf("release after the lane's connection idled and was closed: %v", err)
	}
	if f.d.lane.HasConn() {
		t.Fatal("the lane kept its connection after an idle pause")
	}
}

// TestLaneDropsBrokenConnection: a call that fails on the lane's connection
// (closed by the server within redislane.Idle of its last use) drops it, and the
// next call works.
func TestLaneDropsBrokenConnection(t *testing.T) {
	f, ctx, req, g := grantOnLaneThenKill(t, "lane-broken")
	f.d.lane.SetLastCall(0) // the next call uses the closed connection
	if _, err := f.d.Release(ctx, lease(req, g)); err == nil {
		t.Log("the release over the killed connection succeeded")
		return // nothing was left to find broken
	}
	if f.d.lane.HasConn() {
		t.Fatal("the lane kept a connection whose call failed")
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatalf("release after the lane dropped its broken connection: %v", err)
	}
}

// TestLockUnlockCommands: an uncontended Lock+Unlock through a dlock Client
// sends the server exactly two commands, the acquire and the release
// script (no SCRIPT LOAD, PUBLISH, SUBSCRIBE or other round trip of its
// own), and those scripts run seven commands between them (EXISTS, INCR,
// SET; GET, EXISTS of the queue, DEL, PUBLISH). A guard: the code before
// the lane passes it too.
func TestLockUnlockCommands(t *testing.T) {
	srv := testserver.Redis(t, nil)
	ctx := ctxT(t)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(opt)
	defer admin.Close()
	c, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := c.NewMutex("commands", nil)
	once := func() {
		t.Helper()
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	once() // scripts loaded
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const pairs = 20
	for range pairs {
		once()
	}
	s, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for name, st := range redisinfo.Commands(s) {
		calls[name] = int(st.Calls)
	}
	delete(calls, "info") // this test's own
	delete(calls, "config|resetstat")
	want := map[string]int{"evalsha": 2 * pairs, "exists": 2 * pairs, "incr": pairs, "set": pairs, "get": pairs, "del": pairs, "publish": pairs}
	if !maps.Equal(calls, want) {
		t.Fatalf("%d Lock+Unlock ran %v on the server; want %v", pairs, calls, want)
	}
}

// grantOnLaneThenKill grants name to owner "o" on the lane of a new
// fixture's driver, then has the server close every connection but the
// admin's (the pool's and the lane's).
func grantOnLaneThenKill(t *testing.T, name string) (*fixture, context.Context, driver.AcquireRequest, driver.Grant) {
	t.Helper()
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Minute}
	f.d.lane.SetLastCall(0)
	g, err := f.d.TryAcquire(ctx, req) // on the lane
	if err != nil {
		t.Fatal(err)
	}
	if err := f.admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	if !f.d.lane.HasConn() {
		t.Fatal("back-to-back calls did not use the lane")
	}
	return f, ctx, req, g
}

// TestLaneGivesBackIdleConnection: a lane left idle gives its connection
// back to the pool by itself (redislane.GiveBack after its last call), so a
// driver that stops locking does not keep one of the application's pool
// connections; and a pool smaller than redislane.MinPool gets no lane at all.
func TestLaneGivesBackIdleConnection(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "lane-give-back", Owner: "o", TTL: time.Minute}
	f.d.lane.SetLastCall(0)
	g, err := f.d.TryAcquire(ctx, req) // on the lane
	if err != nil {
		t.Fatal(err)
	}
	if !f.d.lane.HasConn() {
		t.Fatal("back-to-back calls did not use the lane")
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*redislane.GiveBack, "the idle lane to give its connection back to the pool", func() bool { return !f.d.lane.HasConn() })

	opt := f.admin.Options()
	small := *opt
	small.PoolSize = redislane.MinPool - 1
	c := redis.NewClient(&small)
	defer c.Close()
	d, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.lane != nil {
		t.Errorf("a pool of %d connections got a lane", small.PoolSize)
	}
}
