package redisscript

import (
	"context"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// BenchmarkKindScriptCPU measures the Redis server's time per call (INFO
// commandstats, usec_per_call of evalsha) of each kind's acquire and
// release on locks that are free, or, for reads and permits, already held
// by 100 other holders (the holder set's cost grows with log n, not n),
// beside the mutex's, as medians over alternating phases.
func BenchmarkKindScriptCPU(b *testing.B) {
	ctx := context.Background()
	c, stats := statsServer(b)
	perCall := func() float64 { return stats()["evalsha"].UsecPerCall }
	const calls = 1000
	type variant struct {
		name   string
		kind   driver.Kind
		others int // holders already in the set
	}
	variants := []variant{{"mutex", driver.Exclusive, 0}, {"write", driver.Write, 0}, {"read", driver.Read, 0}, {"read-100", driver.Read, 100}, {"permit", driver.Permit, 0}, {"permit-100", driver.Permit, 100}}
	results := map[string][2][]float64{}
	for round := 0; round < max(b.N, 3); round++ {
		for vi, v := range variants {
			names := make([]string, calls)
			for i := range names {
				names[i] = "kcpu-" + strconv.Itoa(round) + "-" + strconv.Itoa(vi) + "-" + strconv.Itoa(i)
			}
			req := func(name, owner string) driver.AcquireRequest {
				return driver.AcquireRequest{Name: name, Owner: owner, TTL: time.Minute, Kind: v.kind, Permits: 1000}
			}
			for _, n := range names[:min(len(names), 20)] {
				for j := range v.others {
					if _, err := AcquireKind(ctx, c, KindKeysFor(DefaultPrefix, n, v.kind), req(n, "x"+strconv.Itoa(j)), 0); err != nil {
						b.Fatal(err)
					}
				}
			}
			_ = c.ConfigResetStat(ctx).Err()
			for i, n := range names {
				n = names[i%20]
				if v.others == 0 {
					n = names[i]
				}
				var err error
				if v.kind == driver.Exclusive {
					_, err = Acquire(ctx, c, KeysFor(DefaultPrefix, n), "o"+strconv.Itoa(i), time.Minute, 0)
				} else {
					_, err = AcquireKind(ctx, c, KindKeysFor(DefaultPrefix, n, v.kind), req(n, "o"+strconv.Itoa(i)), 0)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			acq := perCall()
			_ = c.ConfigResetStat(ctx).Err()
			for i, n := range names {
				n = names[i%20]
				if v.others == 0 {
					n = names[i]
				}
				var err error
				if v.kind == driver.Exclusive {
					_, _, err = Release(ctx, c, KeysFor(DefaultPrefix, n), "o"+strconv.Itoa(i), 0)
				} else {
					_, _, err = ReleaseKind(ctx, c, KindKeysFor(DefaultPrefix, n, v.kind), "o"+strconv.Itoa(i), 0)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			r := results[v.name]
			r[0], r[1] = append(r[0], acq), append(r[1], perCall())
			results[v.name] = r
		}
	}
	med := func(xs []float64) float64 { sort.Float64s(xs); return xs[len(xs)/2] }
	for _, v := range variants {
		b.ReportMetric(med(results[v.name][0]), v.name+"-acquire-µs")
		b.ReportMetric(med(results[v.name][1]), v.name+"-release-µs")
	}
}
