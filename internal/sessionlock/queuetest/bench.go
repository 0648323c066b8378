package queuetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
