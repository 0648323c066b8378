package dlock_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// The benchmarks of this file measure what holding many leases costs a
// Client, on memlock so that no network noise hides it:
//
//	go test -run '^$' -bench 'WithHeld|HeapPerLease|Acquire10000' -count 5 .
//
// Each reports its ratio against a floor measured in the same run.

// heldNames returns n distinct lock names, made before any measurement so
// that the names (the caller's data) are not counted as the library's.
func heldNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%d", prefix, i)
	}
	return names
}

// holdAll takes one lease on each name and fails b if any Lock fails.
func holdAll(b *testing.B, c *dlock.Client, names []string) []*dlock.Lease {
	b.Helper()
	ctx := context.Background()
	leases := make([]*dlock.Lease, len(names))
	for i, name := range names {
		l, err := c.NewMutex(name, nil).Lock(ctx)
		if err != nil {
			b.Fatalf("Lock %q: %v", name, err)
		}
		leases[i] = l
	}
	return leases
}

// BenchmarkLockUnlockWithHeld measures one Lock+Unlock of an unrelated name
// on a client that holds no lease, then on one that holds 10,000. The second
// reports held10000/held0, the ratio of the two ns/op of the same run: 1.0
// means the cost does not grow with the leases held.
func BenchmarkLockUnlockWithHeld(b *testing.B) {
	var base float64 // ns/op with none held, from the same run
	for _, held := range []int{0, 10000} {
		names := heldNames("held", held)
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
			c := dlock.New(memlock.NewBackend().NewDriver(), nil)
			defer c.Close()
			leases := holdAll(b, c, names)
			m := c.NewMutex("hot", nil)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := m.Lock(ctx)
				if err != nil {
					b.Fatalf("Lock: %v", err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatalf("Unlock: %v", err)
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if held == 0 {
				base = perOp
			} else if base > 0 {
				b.ReportMetric(perOp/base, "held10000/held0")
			}
			for _, l := range leases {
				if l.Err() != nil {
					b.Fatalf("a held lease ended during the run: %v", l.Err())
				}
			}
		})
	}
}

// heapInUse returns the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkHeapPerLease reports the heap a held lease costs, at 10,000
// leases held by one client: B/lease counts everything (the Client's books
// and the memlock backend's record of the lock), driver-B/lease what the
// bare memlock driver keeps for 10,000 grants, and client-B/lease the
// difference, the dlock package's own share.
func BenchmarkHeapPerLease(b *testing.B) {
	const n = 10000
	names := heldNames("mem", n)
	var total, bare float64
	for b.Loop() {
		// The bare driver: 10,000 grants and their records on the backend.
		d := memlock.NewBackend().NewDriver()
		before := heapInUse()
		grants := make([]driver.Grant, n)
		for i, name := range names {
			g, err := d.TryAcquire(context.Background(), driver.AcquireRequest{Name: name, Owner: fmt.Sprintf("%032x", i), TTL: dlock.DefaultTTL})
			if err != nil {
				b.Fatalf("TryAcquire: %v", err)
			}
			grants[i] = g
		}
		bare = float64(int64(heapInUse())-int64(before)) / n
		runtime.KeepAlive(grants)
		runtime.KeepAlive(d)
		_ = d.Close()

		c := dlock.New(memlock.NewBackend().NewDriver(), nil)
		before = heapInUse()
		leases := holdAll(b, c, names)
		total = float64(int64(heapInUse())-int64(before)) / n
		runtime.KeepAlive(leases)
		_ = c.Close()
	}
	b.ReportMetric(total, "B/lease")
	b.ReportMetric(bare, "driver-B/lease")
	b.ReportMetric(total-bare, "client-B/lease")
}

// BenchmarkAcquire10000 takes 10,000 locks of distinct names with Lock on a
// fresh client, and 10,000 with the bare memlock driver's TryAcquire in the
// same iteration: ms/10000 is dlock's time, driver-ms/10000 the driver's,
// and vs-driver their ratio.
func BenchmarkAcquire10000(b *testing.B) {
	const n = 10000
	names := heldNames("acq", n)
	var dl, bare time.Duration
	for b.Loop() {
		d := memlock.NewBackend().NewDriver()
		start := time.Now()
		for i, name := range names {
			if _, err := d.TryAcquire(context.Background(), driver.AcquireRequest{Name: name, Owner: fmt.Sprintf("%032x", i), TTL: dlock.DefaultTTL}); err != nil {
				b.Fatalf("TryAcquire: %v", err)
			}
		}
		bare += time.Since(start)
		_ = d.Close()

		c := dlock.New(memlock.NewBackend().NewDriver(), nil)
		start = time.Now()
		leases := holdAll(b, c, names)
		dl += time.Since(start)
		runtime.KeepAlive(leases)
		_ = c.Close()
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(ms(dl), "ms/10000")
	b.ReportMetric(ms(bare), "driver-ms/10000")
	b.ReportMetric(float64(dl)/float64(bare), "vs-driver")
}
