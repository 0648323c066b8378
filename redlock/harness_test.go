package redlock

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// harness runs the conformance suite and benchmarks against n
// independent redis-servers started for the test.
type harness struct {
	srvs   []*testserver.Server
	admins []*redis.Client
}

func newHarnessN(n int) locktest.NewHarness {
	return func(ctx context.Context, t testing.TB) (locktest.Harness, error) {
		h := &harness{srvs: testserver.RedisN(t, n, nil)}
		for _, s := range h.srvs {
			opt, err := redis.ParseURL(s.URL())
			if err != nil {
				return nil, err
			}
			h.admins = append(h.admins, redis.NewClient(opt))
		}
		return h, nil
	}
}

// redlockURL is the redlock:// URL of servers.
func redlockURL(srvs []*testserver.Server, query string) string {
	hosts := make([]string, len(srvs))
	for i, s := range srvs {
		hosts[i] = s.Addr()
	}
	u := "redlock://" + strings.Join(hosts, ",") + "/0"
	if query != "" {
		u += "?" + query
	}
	return u
}

func openTest(ctx context.Context, raw string) (*Driver, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	d, err := OpenURL(ctx, u)
	if err != nil {
		return nil, err
	}
	return d.(*Driver), nil
}

// testNodeTimeout is longer than the default for the 1s test TTL (100ms):
// the test machine's two cores are shared with many other test processes,
// and a loaded -race run misses 100ms now and then.
const testNodeTimeout = "node_timeout=300ms"

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	return openTest(ctx, redlockURL(h.srvs, testNodeTimeout))
}

func (h *harness) Kill(d driver.Driver) error {
	rd, ok := d.(*Driver)
	if !ok {
		return fmt.Errorf("not a redlock driver: %T", d)
	}
	rd.kill()
	return nil
}

// Drop forgets the grant on every node, as an expiry would.
func (h *harness) Drop(ctx context.Context, name string) error {
	for _, a := range h.admins {
		if _, err := redisscript.Drop(ctx, a, redisscript.KeysFor(DefaultKeyPrefix, name)); err != nil {
			return err
		}
	}
	return nil
}

// DropKind forgets the grants of kind k on every node, as a loss would.
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	for _, a := range h.admins {
		if _, err := redisscript.DropKind(ctx, a, redisscript.KindKeysFor(DefaultKeyPrefix, name, k)); err != nil {
			return err
		}
	}
	return nil
}

var _ locktest.KindDropper = (*harness)(nil)

func (h *harness) Config() locktest.Config {
	return locktest.Config{TTL: time.Second, LockDelay: true, Clients: 3}
}

func (h *harness) Close() {
	for _, a := range h.admins {
		_ = a.Close()
	}
}

var compareAndDelete = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`)

func (h *harness) rawClients() ([]*redis.Client, func(), error) {
	var cs []*redis.Client
	for _, s := range h.srvs {
		opt, err := redis.ParseURL(s.URL())
		if err != nil {
			return nil, nil, err
		}
		opt.PoolSize = 1
		cs = append(cs, redis.NewClient(opt))
	}
	return cs, func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}, nil
}

// parallel runs fn on every client at once and returns the first error.
func parallel(cs []*redis.Client, fn func(c *redis.Client) error) error {
	for _, err := range redisscript.OnEach(cs, fn) {
		if err != nil {
			return err
		}
	}
	return nil
}

// AcquireReleaseFloor is the raw Redlock pair: SET NX PX on every node in
// parallel, then the compare-and-delete script on every node in parallel.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	cs, cleanup, err := h.rawClients()
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, key string) error {
		if err := parallel(cs, func(c *redis.Client) error { return c.Do(ctx, "set", key, "owner", "nx", "px", 30000).Err() }); err != nil {
			return err
		}
		return parallel(cs, func(c *redis.Client) error { return compareAndDelete.Run(ctx, c, []string{key}, "owner").Err() })
	}, cleanup, nil
}

// RoundTripFloor is a PING to every node in parallel: one raw Redlock round
// trip.
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	cs, cleanup, err := h.rawClients()
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context) error {
		return parallel(cs, func(c *redis.Client) error { return c.Ping(ctx).Err() })
	}, cleanup, nil
}

var _ locktest.Floors = (*harness)(nil)

func TestConformance3(t *testing.T) { locktest.RunConformanceTests(t, newHarnessN(3)) }
func TestConformance5(t *testing.T) { locktest.RunConformanceTests(t, newHarnessN(5)) }

func BenchmarkLocks3(b *testing.B) { locktest.RunBenchmarks(b, newHarnessN(3)) }
