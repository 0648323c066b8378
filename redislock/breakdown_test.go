package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/bench/floor"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// BenchmarkBreakdown splits an uncontended Lock+Unlock into layers,
// interleaved round-robin on one server (each op on a name of its own,
// every call under a context with a deadline, as the peer comparison
// calls them): the raw floor (SET NX PX + scripted delete) on a dedicated
// connection and on a pooled client like the driver's, dlock's two scripts
// on that client, the driver's TryAcquire+Release, and a dlock Client's
// Mutex Lock+Unlock. Metrics: each layer's p50 (µs) and its ratio to the
// floor on one connection.
func BenchmarkBreakdown(b *testing.B) {
	srv := testserver.Redis(b, nil)
	ctx := context.Background()
	d := openURLDriver(b, srv.URL())
	cl, err := dlock.Open(ctx, srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	opt, _ := redis.ParseURL(srv.URL())
	opt.PoolSize = 1
	one := redis.NewClient(opt)
	defer one.Close()
	opt, _ = redis.ParseURL(srv.URL())
	opt.ContextTimeoutEnabled = true
	pooled := redis.NewClient(opt)
	defer pooled.Close()

	m := cl.NewMutex("bd-client", nil)
	k := redisscript.KeysFor(DefaultKeyPrefix, "bd-scripts")
	req := driver.AcquireRequest{Name: "bd-driver", Owner: "o1", TTL: 30 * time.Second}
	names := []string{"floor-1conn", "floor-pool", "scripts", "driver", "client"}
	ops := []func(ctx context.Context) error{
		func(ctx context.Context) error { return floor.RedisAcquireRelease(ctx, one, "bd-floor1") },
		func(ctx context.Context) error { return floor.RedisAcquireRelease(ctx, pooled, "bd-floorp") },
		func(ctx context.Context) error {
			r, err := redisscript.Acquire(ctx, pooled, k, "o1", 30*time.Second, 0)
			if err != nil {
				return err
			}
			_, _, err = redisscript.Release(ctx, pooled, k, "o1", r.Fence)
			return err
		},
		func(ctx context.Context) error {
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				return err
			}
			_, err = d.Release(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle})
			return err
		},
		func(ctx context.Context) error {
			l, err := m.Lock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		},
	}
	for i, op := range ops {
		ops[i] = func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return op(ctx)
		}
	}
	if _, err := locktest.Interleave(ctx, locktest.Budget{Max: 50}, ops); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	ds, err := locktest.Interleave(ctx, locktest.Budget{Max: max(b.N, 200)}, ops)
	if err != nil {
		b.Fatal(err)
	}
	base := locktest.Summarize(ds[0]).P50
	for i, n := range names {
		p := locktest.Summarize(ds[i]).P50
		b.ReportMetric(float64(p.Nanoseconds())/1e3, n+"-µs")
		if i > 0 {
			b.ReportMetric(float64(p)/float64(base), n+"/floor")
		}
	}
}
