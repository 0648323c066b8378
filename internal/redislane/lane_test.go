package redislane_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/redislane"
	"github.com/dlock/dlock/internal/redisscript/redistest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestMain checks for leaked goroutines after the tests.
func TestMain(m *testing.M) { redistest.Main(m, 1) }

var echo = redis.NewScript(`return ARGV[1]`)

// TestClientDropsBrokenConnection: a script call through a Client that
// fails on the lane's connection (closed by the server within Idle of its
// last use) drops that connection, and the next call works; a call after
// an idle pause goes through the pool, and the lane gives its connection
// back.
func TestClientDropsBrokenConnection(t *testing.T) {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	admin := redis.NewClient(opt)
	defer admin.Close()
	c, lane := redislane.Wrap(redis.NewClient(opt))
	defer c.Close()
	defer lane.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	run := func() error { return echo.Run(ctx, c, nil, "x").Err() }
	// Back to back means within a minute here, not 5ms: under a loaded
	// make test a round trip (the script's EVALSHA, NOSCRIPT, then EVAL)
	// took longer, and the lane rightly gave its connection up. An hour
	// still reads as an idle pause.
	lane.SetIdle(time.Minute)
	lane.SetLastCall(0)
	if err := run(); err != nil { // loads the script, on the lane
		t.Fatal(err)
	}
	if !lane.HasConn() {
		t.Fatal("back-to-back calls did not use the lane")
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	lane.SetLastCall(0) // the next call uses the closed connection
	if err := run(); err == nil {
		t.Fatal("a call over the killed lane connection succeeded")
	}
	if lane.HasConn() {
		t.Fatal("the lane kept a connection whose call failed")
	}
	if err := run(); err != nil {
		t.Fatalf("call after the lane dropped its broken connection: %v", err)
	}
	lane.SetLastCall(0)
	if err := run(); err != nil || !lane.HasConn() {
		t.Fatalf("back-to-back call: %v, lane has a connection: %v", err, lane.HasConn())
	}
	lane.SetLastCall(time.Hour)
	if err := run(); err != nil {
		t.Fatal(err)
	}
	if lane.HasConn() {
		t.Fatal("the lane kept its connection after an idle pause")
	}
}

// TestWrapOnlyLargePools: Wrap leaves a pool smaller than MinPool, and a
// client other than a *redis.Client, as they are.
func TestWrapOnlyLargePools(t *testing.T) {
	small := redis.NewClient(&redis.Options{Addr: "localhost:1", PoolSize: redislane.MinPool - 1})
	defer small.Close()
	if c, lane := redislane.Wrap(small); c != redis.UniversalClient(small) || lane != nil {
		t.Errorf("a pool of %d connections got a lane", redislane.MinPool-1)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "localhost:1"}})
	defer ring.Close()
	if _, lane := redislane.Wrap(ring); lane != nil {
		t.Error("a ring got a lane")
	}
}
