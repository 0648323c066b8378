package redislock

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// harness runs the conformance suite and benchmarks against one
// redis-server started for the test.
type harness struct {
	srv   *testserver.Server
	admin *redis.Client
}

func newHarness(ctx context.Context, t testing.TB) (locktest.Harness, error) {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		return nil, err
	}
	return &harness{srv: srv, admin: redis.NewClient(opt)}, nil
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	u, err := url.Parse(h.srv.URL())
	if err != nil {
		return nil, err
	}
	return OpenURL(ctx, u)
}

func (h *harness) Kill(d driver.Driver) error {
	rd, ok := d.(*Driver)
	if !ok {
		return fmt.Errorf("not a redislock driver: %T", d)
	}
	rd.kill()
	return nil
}

func (h *harness) Drop(ctx context.Context, name string) error {
	_, err := redisscript.Drop(ctx, h.admin, redisscript.KeysFor(DefaultKeyPrefix, name))
	return err
}

func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	_, err := redisscript.DropKind(ctx, h.admin, redisscript.KindKeysFor(DefaultKeyPrefix, name, k))
	return err
}

var _ locktest.KindDropper = (*harness)(nil)

func (h *harness) Config() locktest.Config {
	return locktest.Config{TTL: time.Second, LockDelay: true, Clients: 3}
}

func (h *harness) Close() { _ = h.admin.Close() }

// compareAndDelete is the seeds' owner-checked release, the raw floor's
// second half.
var compareAndDelete = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`)

// AcquireReleaseFloor is a bare SET NX PX plus an EVALSHA compare-and-delete
// on one connection.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	opt, err := redis.ParseURL(h.srv.URL())
	if err != nil {
		return nil, nil, err
	}
	opt.PoolSize = 1
	c := redis.NewClient(opt)
	return func(ctx context.Context, key string) error {
		return rawAcquireRelease(ctx, c, key)
	}, func() { _ = c.Close() }, nil
}

func rawAcquireRelease(ctx context.Context, c *redis.Client, key string) error {
	if err := c.Do(ctx, "set", key, "owner", "nx", "px", 30000).Err(); err != nil {
		return fmt.Errorf("floor SET NX PX %q: %w", key, err)
	}
	return compareAndDelete.Run(ctx, c, []string{key}, "owner").Err()
}

// RoundTripFloor is one PING.
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	opt, err := redis.ParseURL(h.srv.URL())
	if err != nil {
		return nil, nil, err
	}
	opt.PoolSize = 1
	c := redis.NewClient(opt)
	return func(ctx context.Context) error { return c.Ping(ctx).Err() }, func() { _ = c.Close() }, nil
}

var _ locktest.Floors = (*harness)(nil)

func TestConformance(t *testing.T) { locktest.RunConformanceTests(t, newHarness) }

func BenchmarkLocks(b *testing.B) { locktest.RunBenchmarks(b, newHarness) }
