package redislock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TestLaneSkipsPool: back-to-back grants and releases of a driver over a
// *redis.Client use the driver's own connection, not go-redis's pool (whose
// Get checks the connection with a system call each time). Before the lane,
// each pair took two connections from the pool.
func TestLaneSkipsPool(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "lane", Owner: "o", TTL: time.Minute}
	pair := func() {
		t.Helper()
		g, err := f.d.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
			t.Fatal(err)
		}
	}
	pair()
	st := f.admin.PoolStats()
	before := st.Hits + st.Misses
	const pairs = 50
	for range pairs {
		pair()
	}
	st = f.admin.PoolStats()
	// A pause longer than laneIdle (a slow machine) sends one pair back
	// to the pool; the pool would serve all 2*pairs calls.
	if gets := st.Hits + st.Misses - before; gets > pairs/5 {
		t.Fatalf("%d pairs took %d connections from the pool; want (almost) none", pairs, gets)
	}
}

// TestLaneIdleGoesThroughPool: once the lane's connection has been idle
// longer than laneIdle, the next call takes a fresh one from the pool,
// whose check finds a connection the server closed meanwhile: the call
// succeeds.
func TestLaneIdleGoesThroughPool(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "lane-idle", Owner: "o", TTL: time.Minute}
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// The server closes every connection but the admin's (pool and lane).
	if err := f.admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	f.d.lane.mu.Lock()
	f.d.lane.used = time.Now().Add(-time.Hour)
	f.d.lane.mu.Unlock()
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatalf("release over the lane after its connection idled and was closed: %v", err)
	}
}

// TestLaneDropsBrokenConnection: a call that fails on the lane's connection
// (closed by the server within laneIdle of its last use) drops it, and the
// next call works.
func TestLaneDropsBrokenConnection(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "lane-broken", Owner: "o", TTL: time.Minute}
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	f.d.lane.mu.Lock()
	f.d.lane.used = time.Now().Add(time.Hour) // never idle: the next call uses the closed connection
	f.d.lane.mu.Unlock()
	if _, err := f.d.Release(ctx, lease(req, g)); err == nil {
		t.Log("the release over the killed connection succeeded")
		return // nothing was left to find broken
	}
	if f.d.lane.conn != nil {
		t.Fatal("the lane kept a connection whose call failed")
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatalf("release after the lane dropped its broken connection: %v", err)
	}
}
