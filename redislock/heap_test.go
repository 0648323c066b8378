package redislock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/heapbench"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// BenchmarkHeapPerLease holds b.N locks (at least 1000; the goal is
// measured at -benchtime=10000x) of distinct names through a dlock Client
// on a URL-opened driver, each taken with a context.WithTimeout of its own
// cancelled once Lock returns, as the peer comparison takes them, and
// reports the heap they keep alive per held lock (B/lease; the whole
// process, after a GC). With REDISLOCK_HEAP_PROFILE set (and
// -memprofilerate=1) it writes a heap profile of what stays alive.
func BenchmarkHeapPerLease(b *testing.B) {
	srv := testserver.Redis(b, nil)
	c := dlock.New(openURLDriver(b, srv.URL()), nil)
	defer c.Close()
	heapbench.PerLease(b, "REDISLOCK_HEAP_PROFILE", heapbench.ClientLocks(b, c, nil, true))
}

// BenchmarkAcquireHeld takes n locks of distinct names, holding them all,
// in four ways interleaved one lock at a time, each with a per-call
// context.WithTimeout as the peer comparison takes them: SET NX PX on a
// go-redis client of its own (floor), the bare driver's Acquire (driver), a
// Client's Lock (lock) and TryLock (trylock). It reports the median per lock
// of each over b.N rounds, and lock and trylock over floor.
func BenchmarkAcquireHeld(b *testing.B) {
	const n = 2000
	srv := testserver.Redis(b, nil)
	d := openURLDriver(b, srv.URL())
	c := dlock.New(openURLDriver(b, srv.URL()), nil)
	defer c.Close()
	opt, _ := redis.ParseURL(srv.URL())
	raw := redis.NewClient(opt)
	defer raw.Close()
	ctx := context.Background()
	timed := func(f func(ctx context.Context) error) time.Duration {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		t0 := time.Now()
		err := f(lctx)
		el := time.Since(t0)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		return el
	}
	var floor, drv, lock, try []time.Duration
	round := 0
	for b.Loop() {
		round++
		var sums [4]time.Duration
		var leases []*dlock.Lease
		for i := range n {
			name := fmt.Sprintf("acq-%d-%d", round, i)
			sums[0] += timed(func(ctx context.Context) error {
				return raw.SetNX(ctx, "floor-"+name, "owner", 30*time.Second).Err()
			})
			sums[1] += timed(func(ctx context.Context) error {
				_, err := d.Acquire(ctx, driver.AcquireRequest{Name: "drv-" + name, Owner: name, TTL: 30 * time.Second})
				return err
			})
			sums[2] += timed(func(ctx context.Context) error {
				l, err := c.NewMutex("lock-"+name, nil).Lock(ctx)
				leases = append(leases, l)
				return err
			})
			sums[3] += timed(func(ctx context.Context) error {
				l, err := c.NewMutex("try-"+name, nil).TryLock(ctx)
				leases = append(leases, l)
				return err
			})
		}
		floor, drv, lock, try = append(floor, sums[0]/n), append(drv, sums[1]/n), append(lock, sums[2]/n), append(try, sums[3]/n)
		for _, l := range leases {
			_ = l.Unlock(ctx)
		}
	}
	us := func(ds []time.Duration) float64 { return float64(locktest.Median(ds).Nanoseconds()) / 1000 }
	b.ReportMetric(us(floor), "floor-µs")
	b.ReportMetric(us(drv), "driver-µs")
	b.ReportMetric(us(lock), "lock-µs")
	b.ReportMetric(us(try), "trylock-µs")
	b.ReportMetric(us(lock)/us(floor), "lock/floor")
	b.ReportMetric(us(try)/us(floor), "trylock/floor")
}
