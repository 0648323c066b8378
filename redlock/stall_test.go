package redlock

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// BenchmarkHotLockStalls3 is BenchmarkHotLock3's 8-client hot lock on 3
// nodes, reporting its stalls: the longest hand-off, the hand-offs of 50
// ms or more per second, and the share of the run spent in them (a split
// grant not resolved at once shows as one of the node timeout).
func BenchmarkHotLockStalls3(b *testing.B) {
	srvs := testserver.RedisN(b, 3, nil)
	ctx := context.Background()
	lockers := hotLockers(b, srvs, "perf-stalls")
	b.ResetTimer()
	var longest, stalled, el time.Duration
	var stalls, ops int
	for range b.N {
		r, err := locktest.HotLock(ctx, locktest.Budget{Duration: time.Second}, lockers)
		if err != nil {
			b.Fatal(err)
		}
		for _, h := range r.Handoffs {
			longest = max(longest, h)
			if h >= 50*time.Millisecond {
				stalls++
				stalled += h
			}
		}
		ops += r.Ops
		el += r.Elapsed
	}
	b.StopTimer()
	b.ReportMetric(float64(longest.Microseconds()), "longest-µs")
	b.ReportMetric(float64(stalls)/el.Seconds(), "stalls/s")
	b.ReportMetric(100*stalled.Seconds()/el.Seconds(), "stalled-%")
	b.ReportMetric(float64(ops)/el.Seconds(), "ops/s")
}
