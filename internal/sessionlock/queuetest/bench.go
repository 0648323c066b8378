package queuetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/locktest"
)

// NativeHotLock is the hot-lock hand-off scenario of locktest.RunBenchmarks
// run with a backend's own lock recipe, for comparison in the same run: for
// 8 and 32 contenders, the median of 200 round trips of the floor made by
// roundTripFloor (a locktest.Floors method) is measured, newLocks makes one
// lock and unlock function pair per contender, all on one lock, and the
// contenders hand it around b.N times.
func NativeHotLock(b *testing.B, roundTripFloor func(context.Context) (func(context.Context) error, func(), error), newLocks func(b *testing.B, contenders int) (lock, unlock func(g int) error)) {
	for _, n := range []int{8, 32} {
		b.Run(fmt.Sprintf("contenders=%d", n), func(b *testing.B) {
			ctx := context.Background()
			rtt, cleanup, err := roundTripFloor(ctx)
			if err != nil {
				b.Fatal(err)
			}
			var ds []time.Duration
			for range 200 {
				t0 := time.Now()
				if err := rtt(ctx); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t0))
			}
			cleanup()
			lock, unlock := newLocks(b, n)
			locktest.ReportHandoffs(b, hotLock(b, n, lock, unlock), locktest.Median(ds))
		})
	}
}

// hotLock runs the hot-lock loop of locktest's benchmark over lock and
// unlock functions and returns the hand-off latencies.
func hotLock(b *testing.B, contenders int, lock, unlock func(g int) error) []time.Duration {
	var (
		remaining  atomic.Int64
		releasedAt atomic.Int64
		mu         sync.Mutex
		handoffs   []time.Duration
		wg         sync.WaitGroup
		stop       atomic.Bool
		errOnce    sync.Once
		firstErr   error
	)
	remaining.Store(int64(b.N))
	b.ResetTimer()
	start := time.Now()
	for g := range contenders {
		wg.Go(func() {
			for !stop.Load() {
				if err := lock(g); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				if at := releasedAt.Swap(0); at != 0 {
					mu.Lock()
					handoffs = append(handoffs, time.Duration(time.Now().UnixNano()-at))
					mu.Unlock()
				}
				left := remaining.Add(-1)
				releasedAt.Store(time.Now().UnixNano())
				if left <= 0 {
					stop.Store(true)
				}
				if err := unlock(g); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	return handoffs
}

// Uncontended measures one uncontended Lock+Unlock cycle of dlock, of a
// peer lock library and of the backend's raw floor (the fewest requests a
// lock can cost), interleaved: each iteration runs one cycle of each, so
// that all three see the same server and machine load. It reports the p50
// of each in µs and the ratios dlock/peer and dlock/floor.
func Uncontended(b *testing.B, floor, dlock, peer func(context.Context) error) {
	ctx := context.Background()
	cycles := []func(context.Context) error{floor, dlock, peer}
	ds := make([][]time.Duration, len(cycles))
	run := func(i int) {
		t0 := time.Now()
		if err := cycles[i](ctx); err != nil {
			b.Fatalf("cycle %d: %v", i, err)
		}
		ds[i] = append(ds[i], time.Since(t0))
	}
	for range 20 { // warm up: connections, leases, sessions, parents
		for i := range cycles {
			run(i)
		}
	}
	for i := range ds {
		ds[i] = ds[i][:0]
	}
	b.ResetTimer()
	for n := range b.N {
		for k := range cycles {
			run((n + k) % len(cycles)) // rotate who goes first
		}
	}
	b.StopTimer()
	p := make([]float64, len(ds))
	for i := range ds {
		p[i] = float64(locktest.Median(ds[i]).Nanoseconds()) / 1e3
	}
	b.ReportMetric(p[0], "floor-p50-µs")
	b.ReportMetric(p[1], "dlock-p50-µs")
	b.ReportMetric(p[2], "peer-p50-µs")
	b.ReportMetric(p[1]/p[2], "dlock/peer")
	b.ReportMetric(p[1]/p[0], "dlock/floor")
}

// UncontendedClientAndDriver runs Uncontended on lock name with dlock's
// Lock+Unlock measured two ways: through a dlock Client with TTL ttl
// (sub-benchmark client) and as Acquire+Release on the bare driver (driver),
// each over a driver from newDriver, which the caller closes.
func UncontendedClientAndDriver(b *testing.B, name string, ttl time.Duration, newDriver func(testing.TB) Driver, floor, peer func(context.Context) error) {
	b.Run("client", func(b *testing.B) {
		c := dlock.New(newDriver(b), &dlock.Options{TTL: ttl})
		defer c.Close()
		mu := c.NewMutex(name+"-client", nil)
		Uncontended(b, floor, func(ctx context.Context) error {
			l, err := mu.Lock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		}, peer)
	})
	b.Run("driver", func(b *testing.B) {
		d := newDriver(b)
		req := Req(name+"-driver", "A")
		req.TTL = ttl
		Uncontended(b, floor, func(ctx context.Context) error {
			g, err := d.Acquire(ctx, req)
			if err != nil {
				return err
			}
			_, err = d.Release(ctx, Lease(req.Name, req.Owner, g))
			return err
		}, peer)
	})
}

// Growth runs cycle (one Lock+Unlock of the same name) max(b.N, 2000) times
// and reports the p50 of the first and of the last 1000 cycles in µs and
// their ratio last/first, which stays near 1 when the cost of a lock does
// not depend on how often the name was locked before. Run it with e.g.
// -benchtime=100000x.
func Growth(b *testing.B, cycle func(context.Context) error) {
	ctx := context.Background()
	n := max(b.N, 2000)
	ds := make([]time.Duration, n)
	b.ResetTimer()
	for i := range n {
		t0 := time.Now()
		if err := cycle(ctx); err != nil {
			b.Fatalf("cycle %d: %v", i, err)
		}
		ds[i] = time.Since(t0)
	}
	b.StopTimer()
	first := float64(locktest.Median(ds[:1000]).Nanoseconds()) / 1e3
	last := float64(locktest.Median(ds[n-1000:]).Nanoseconds()) / 1e3
	b.ReportMetric(first, "first1000-p50-µs")
	b.ReportMetric(last, "last1000-p50-µs")
	b.ReportMetric(last/first, "last/first")
}
