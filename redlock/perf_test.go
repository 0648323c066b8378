package redlock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/heapbench"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// rsLike is a Redlock in redsync's manner, the peer dlock is compared with:
// SET NX PX on every node at once (a goroutine each, all answers awaited),
// then the compare-and-delete script on every node, retrying a refused
// Lock after a random 50–250 ms (redsync's default).
type rsLike struct{ cs []*redis.Client }

func (r rsLike) lock(name string) locktest.LockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		val := fmt.Sprint(rand.Uint64())
		quorum := len(r.cs)/2 + 1
		for {
			var mu sync.Mutex
			ok := 0
			var wg sync.WaitGroup
			for _, c := range r.cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if set, _ := c.SetNX(ctx, name, val, time.Minute).Result(); set {
						mu.Lock()
						ok++
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			unlock := func(ctx context.Context) error {
				var wg sync.WaitGroup
				for _, c := range r.cs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						compareAndDelete.Run(ctx, c, []string{name}, val)
					}()
				}
				wg.Wait()
				return nil
			}
			if ok >= quorum {
				return unlock, nil
			}
			_ = unlock(ctx)
			t := time.NewTimer(50*time.Millisecond + rand.N(200*time.Millisecond))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
		}
	}
}

func newRSLike(b *testing.B, srvs []*testserver.Server) rsLike {
	var r rsLike
	for _, s := range srvs {
		opt, err := redis.ParseURL(s.URL())
		if err != nil {
			b.Fatal(err)
		}
		c := redis.NewClient(opt)
		b.Cleanup(func() { _ = c.Close() })
		r.cs = append(r.cs, c)
	}
	return r
}

func perfClient(b *testing.B, srvs []*testserver.Server) *dlock.Client {
	d, err := openTest(context.Background(), redlockURL(srvs, ""))
	if err != nil {
		b.Fatal(err)
	}
	c := dlock.New(d, nil)
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkUncontended3 interleaves dlock's Lock+Unlock (the waiting
// Lock, as the peer comparison runs it), the raw floor (SET NX PX and
// compare-and-delete on every node) and a redsync-like Redlock on 3 nodes,
// and reports each one's median and dlock's ratio to the others.
func BenchmarkUncontended3(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	ctx := context.Background()
	c := perfClient(b, srvs)
	m := c.NewMutex("perf-uncontended", nil)
	h := &harness{srvs: srvs}
	floor, cleanup, err := h.AcquireReleaseFloor(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	rs := newRSLike(b, srvs).lock("perf-rs")
	once := func(lf locktest.LockFunc) func(context.Context) error {
		return func(ctx context.Context) error {
			u, err := lf(ctx)
			if err != nil {
				return err
			}
			return u(ctx)
		}
	}
	ops := []func(context.Context) error{
		once(locktest.MutexLocker(m)),
		func(ctx context.Context) error { return floor(ctx, "perf-floor") },
		once(rs),
	}
	ds := locktest.InterleaveN(ctx, b, 20, ops)
	d, f, r := locktest.Median(ds[0]), locktest.Median(ds[1]), locktest.Median(ds[2])
	b.ReportMetric(float64(d.Microseconds()), "dlock-p50-µs")
	b.ReportMetric(float64(f.Microseconds()), "floor-p50-µs")
	b.ReportMetric(float64(r.Microseconds()), "rslike-p50-µs")
	b.ReportMetric(float64(d)/float64(f), "dlock/floor")
	b.ReportMetric(float64(d)/float64(r), "dlock/rslike")
}

// hotLockers are 8 contenders for the lock name on srvs, each through a
// client of its own, as the peer comparison's hot lock has them.
func hotLockers(b *testing.B, srvs []*testserver.Server, name string) []locktest.LockFunc {
	var lockers []locktest.LockFunc
	for range 8 {
		lockers = append(lockers, locktest.MutexLocker(perfClient(b, srvs).NewMutex(name, nil)))
	}
	return lockers
}

// BenchmarkHotLock3 is the peer comparison's hot lock on 3 nodes: 8
// goroutines, each with a client of its own, take and free one lock.
func BenchmarkHotLock3(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	ctx := context.Background()
	lockers := hotLockers(b, srvs, "perf-hot")
	b.ResetTimer()
	var all []time.Duration
	var ops, retakes int
	var el time.Duration
	for range b.N {
		r, err := locktest.HotLock(ctx, locktest.Budget{Duration: time.Second}, lockers)
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, r.Handoffs...)
		ops += r.Ops
		retakes += r.Retakes
		el += r.Elapsed
	}
	b.StopTimer()
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "handoff-p50-µs")
		b.ReportMetric(float64(all[min(len(all)-1, len(all)*99/100)].Microseconds()), "handoff-p99-µs")
	}
	b.ReportMetric(float64(ops)/el.Seconds(), "ops/s")
	if ops > 1 {
		b.ReportMetric(100*float64(retakes)/float64(ops-1), "retake-%")
	}
}

// BenchmarkBreakdown3 interleaves the layers of an uncontended Lock+Unlock
// on 3 nodes: the floor, the bare scripts on every node, the driver's
// TryAcquire+Release and Acquire+Release, and the dlock client's.
func BenchmarkBreakdown3(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	ctx := context.Background()
	c := perfClient(b, srvs)
	m := c.NewMutex("perf-core", nil)
	d, err := openTest(ctx, redlockURL(srvs, ""))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	h := &harness{srvs: srvs}
	floor, cleanup, err := h.AcquireReleaseFloor(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	cs, cleanup2, err := h.rawClients()
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup2()
	sk := redisscript.KeysFor(DefaultKeyPrefix, "perf-scripts")
	req := func(name string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: name, Owner: "perf-owner", TTL: 30 * time.Second}
	}
	lease := func(r driver.AcquireRequest, g driver.Grant) driver.Lease {
		return driver.Lease{Name: r.Name, Owner: r.Owner, TTL: r.TTL, Token: g.Token, Handle: g.Handle}
	}
	ops := []func(context.Context) error{
		func(ctx context.Context) error { return floor(ctx, "perf-floor") },
		func(ctx context.Context) error {
			if err := parallel(cs, func(c *redis.Client) error {
				_, err := redisscript.Acquire(ctx, c, sk, "o", 30*time.Second, 0)
				return err
			}); err != nil {
				return err
			}
			return parallel(cs, func(c *redis.Client) error {
				_, _, err := redisscript.Release(ctx, c, sk, "o", 0)
				return err
			})
		},
		func(ctx context.Context) error {
			r := req("perf-try")
			g, err := d.TryAcquire(ctx, r)
			if err != nil {
				return err
			}
			_, err = d.Release(ctx, lease(r, g))
			return err
		},
		func(ctx context.Context) error {
			r := req("perf-acq")
			g, err := d.Acquire(ctx, r)
			if err != nil {
				return err
			}
			_, err = d.Release(ctx, lease(r, g))
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
	names := []string{"floor", "scripts", "try", "acquire", "client"}
	ds := locktest.InterleaveN(ctx, b, 20, ops)
	f := locktest.Median(ds[0])
	for i, n := range names {
		md := locktest.Median(ds[i])
		b.ReportMetric(float64(md.Microseconds()), n+"-µs")
		if i > 0 {
			b.ReportMetric(float64(md)/float64(f), n+"/floor")
		}
	}
}

// BenchmarkHeapPerLease holds b.N locks (at least 1000; the goal is
// measured at -benchtime=10000x) of distinct names on one driver over 3
// nodes, through a dlock Client (client) and as bare driver grants
// (driver), each taken with a plain context, and reports the heap they
// keep alive per held lock (B/lease; the whole process, after a GC). Run
// it with -memprofile and -memprofilerate=1 to see what stays alive.
func BenchmarkHeapPerLease(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	ctx := context.Background()
	run := func(b *testing.B, take func(name string) (release func())) {
		heapbench.PerLease(b, "REDLOCK_HEAP_PROFILE", take)
	}
	b.Run("client", func(b *testing.B) {
		run(b, heapbench.ClientLocks(b, perfClient(b, srvs), &dlock.MutexOptions{TTL: 30 * time.Second}, false))
	})
	b.Run("driver", func(b *testing.B) {
		d, err := openTest(ctx, redlockURL(srvs, ""))
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		run(b, func(name string) func() {
			req := driver.AcquireRequest{Name: name, Owner: "owner", TTL: 30 * time.Second}
			g, err := d.Acquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			return func() {
				l := driver.Lease{Name: name, Owner: "owner", TTL: req.TTL, Token: g.Token, Handle: g.Handle}
				if _, err := d.Release(ctx, l); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}
