package testserver_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
)

func redisClient(t *testing.T, s *testserver.Server) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	opt.MaxRetries = -1
	opt.ContextTimeoutEnabled = true
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestRedisKillRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	start := time.Now()
	s := testserver.Redis(t, nil)
	t.Logf("redis started in %v", time.Since(start))
	c := redisClient(t, s)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded on a killed server")
	}
	if err := s.Restart(false); err != nil {
		t.Fatal(err)
	}
	// Persistence is off by default: a crash loses everything.
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after kill+restart without persistence: err = %v, want redis.Nil", err)
	}
	if err := c.Set(ctx, "k2", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(true); err != nil {
		t.Fatal(err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSIZE after wiped restart = %d, %v; want 0", n, err)
	}
}

func TestRedisAppendOnlySurvivesKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testserver.Redis(t, &testserver.RedisOptions{AppendOnly: true})
	c := redisClient(t, s)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(false); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k after kill+restart with appendonly = %q, %v; want \"v\"", v, err)
	}
	if err := s.Restart(true); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after wiped restart: err = %v, want redis.Nil", err)
	}
}

func TestRedisPauseResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testserver.Redis(t, nil)
	c := redisClient(t, s)
	if err := c.Ping(ctx).Err(); err != nil { // connect before pausing
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := c.Ping(pctx).Err()
	cancel()
	if err == nil {
		t.Fatal("PING answered by a paused server")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestRedisN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ss := testserver.RedisN(t, 3, nil)
	seen := map[string]bool{}
	for i, s := range ss {
		if seen[s.Addr()] {
			t.Fatalf("RedisN returned %s twice", s.Addr())
		}
		seen[s.Addr()] = true
		c := redisClient(t, s)
		if err := c.Set(ctx, "who", i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range ss {
		if v, err := redisClient(t, s).Get(ctx, "who").Int(); err != nil || v != i {
			t.Fatalf("server %d: who = %d, %v; the servers are not independent", i, v, err)
		}
	}
}

func TestRedisFaketime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testserver.Redis(t, &testserver.RedisOptions{Faketime: true})
	c := redisClient(t, s)
	before, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(before); d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("server clock is %v off before any offset was set", d)
	}
	if err := c.Set(ctx, "short", "v", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetClockOffset(time.Hour); err != nil {
		t.Fatal(err)
	}
	after, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if jump := after.Sub(before); jump < time.Hour-5*time.Second || jump > time.Hour+5*time.Second {
		t.Fatalf("TIME moved by %v after SetClockOffset(1h), want about 1h", jump)
	}
	// The jump is what the server uses for expiry too: the 10s key is gone.
	if err := c.Get(ctx, "short").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET of a 10s key after a 1h clock jump: err = %v, want redis.Nil", err)
	}
	if err := s.SetClockOffset(0); err != nil {
		t.Fatal(err)
	}
	back, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(back); d < -2*time.Second || d > 2*time.Second {
		t.Fatalf("server clock is %v off after SetClockOffset(0)", d)
	}
}

func TestRedisNoFaketime(t *testing.T) {
	t.Parallel()
	s := testserver.Redis(t, nil)
	if err := s.SetClockOffset(time.Second); !errors.Is(err, testserver.ErrNoFaketime) {
		t.Fatalf("SetClockOffset without Faketime: err = %v, want ErrNoFaketime", err)
	}
}

// TestRestartWaitsForPort: another process holds the port when Restart runs
// (an outgoing connection can get it as its local port); Restart waits for it
// to come free and starts on the same port.
func TestRestartWaitsForPort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testserver.Redis(t, nil)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	released := time.AfterFunc(500*time.Millisecond, func() { l.Close() })
	defer released.Stop()
	if err := s.Restart(false); err != nil {
		t.Fatal(err)
	}
	if err := redisClient(t, s).Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after a restart that had to wait for its port: %v", err)
	}
}
