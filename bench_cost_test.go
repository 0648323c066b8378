package dlock_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/locktest"
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

// lockUnlock takes and gives back m once, failing b on an error.
func lockUnlock(b *testing.B, m *dlock.Mutex) {
	ctx := context.Background()
	l, err := m.Lock(ctx)
	if err != nil {
		b.Fatalf("Lock: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		b.Fatalf("Unlock: %v", err)
	}
}

// stillHeld fails b if any of leases ended.
func stillHeld(b *testing.B, leases []*dlock.Lease) {
	for _, l := range leases {
		if l.Err() != nil {
			b.Fatalf("a held lease ended during the run: %v", l.Err())
		}
	}
}

// BenchmarkLockUnlockWithHeld measures one Lock+Unlock of an unrelated name
// on a client that holds no lease (held=0), then on one that holds 10,000
// (held=10000), which reports held10000/held0, the ratio of the two ns/op of
// the same run: 1.0 means the cost does not grow with the leases held. On a
// busy machine the two sub-benchmarks see different noise, so interleaved
// runs both clients in turn, a round of operations each, and reports the
// ratio of the medians of their time per operation, by the wall clock
// (p50-held10000/held0) and by the process's CPU time, background work
// included (p50-cpu-held10000/held0).
func BenchmarkLockUnlockWithHeld(b *testing.B) {
	const held = 10000
	names := heldNames("held", held)
	var base float64 // ns/op with none held, from the same run
	b.Run("held=0", func(b *testing.B) {
		c := dlock.New(memlock.NewBackend().NewDriver(), nil)
		defer c.Close()
		m := c.NewMutex("hot", nil)
		b.ReportAllocs()
		for b.Loop() {
			lockUnlock(b, m)
		}
		base = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) {
		c := dlock.New(memlock.NewBackend().NewDriver(), nil)
		defer c.Close()
		leases := holdAll(b, c, names)
		m := c.NewMutex("hot", nil)
		b.ReportAllocs()
		for b.Loop() {
			lockUnlock(b, m)
		}
		if base > 0 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/base, "held10000/held0")
		}
		stillHeld(b, leases)
	})
	b.Run("interleaved", func(b *testing.B) {
		c0 := dlock.New(memlock.NewBackend().NewDriver(), nil)
		defer c0.Close()
		c := dlock.New(memlock.NewBackend().NewDriver(), nil)
		defer c.Close()
		leases := holdAll(b, c, names)
		m0, m := c0.NewMutex("hot", nil), c.NewMutex("hot", nil)
		// Each iteration runs a round of ops on each client in turn.
		// Time is read per round, not per op, so that work the client does
		// in the background because of those ops (renewal scheduling,
		// garbage collection) is counted with them.
		const round = 200
		var wall0, wall, cpu0, cpu []time.Duration
		measure := func(m *dlock.Mutex, walls, cpus *[]time.Duration) {
			start := time.Now()
			cstart, cok := cpuTime()
			for range round {
				lockUnlock(b, m)
			}
			cend, _ := cpuTime()
			*walls = append(*walls, time.Since(start)/round)
			if cok {
				*cpus = append(*cpus, (cend-cstart)/round)
			}
		}
		for b.Loop() {
			measure(m0, &wall0, &cpu0)
			measure(m, &wall, &cpu)
		}
		p0, p := locktest.Median(wall0), locktest.Median(wall)
		b.ReportMetric(float64(p0.Nanoseconds()), "p50-held0-ns/op")
		b.ReportMetric(float64(p.Nanoseconds()), "p50-held10000-ns/op")
		b.ReportMetric(float64(p)/float64(p0), "p50-held10000/held0")
		if len(cpu0) > 0 {
			p0, p := locktest.Median(cpu0), locktest.Median(cpu)
			b.ReportMetric(float64(p0.Nanoseconds()), "p50-held0-cpu-ns/op")
			b.ReportMetric(float64(p.Nanoseconds()), "p50-held10000-cpu-ns/op")
			b.ReportMetric(float64(p)/float64(max(p0, 1)), "p50-cpu-held10000/held0")
		}
		stillHeld(b, leases)
	})
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
// bare memlock driver keeps for 10,000 grants (its records, the owner
// strings among them), and client-B/lease the difference, the dlock
// package's own share (the Lease, its heap slots). The bare driver's grants
// are not kept: a driver.Grant is 96 B that a Client does not keep either,
// and counting it in the driver's share hid as much of the client's.
func BenchmarkHeapPerLease(b *testing.B) {
	const n = 10000
	names := heldNames("mem", n)
	var total, bare float64
	for b.Loop() {
		// The bare driver: 10,000 grants and their records on the backend.
		d := memlock.NewBackend().NewDriver()
		before := heapInUse()
		for i, name := range names {
			if _, err := d.TryAcquire(context.Background(), driver.AcquireRequest{Name: name, Owner: fmt.Sprintf("%032x", i), TTL: dlock.DefaultTTL}); err != nil {
				b.Fatalf("TryAcquire: %v", err)
			}
		}
		bare = float64(int64(heapInUse())-int64(before)) / n
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
// same iteration: ms/10000 is dlock's median time, driver-ms/10000 the
// driver's, and vs-driver the median of their ratio per iteration.
func BenchmarkAcquire10000(b *testing.B) {
	const n = 10000
	names := heldNames("acq", n)
	var dl, bare, ratio []time.Duration
	for b.Loop() {
		d := memlock.NewBackend().NewDriver()
		start := time.Now()
		for i, name := range names {
			if _, err := d.TryAcquire(context.Background(), driver.AcquireRequest{Name: name, Owner: fmt.Sprintf("%032x", i), TTL: dlock.DefaultTTL}); err != nil {
				b.Fatalf("TryAcquire: %v", err)
			}
		}
		tb := time.Since(start)
		_ = d.Close()

		c := dlock.New(memlock.NewBackend().NewDriver(), nil)
		start = time.Now()
		leases := holdAll(b, c, names)
		td := time.Since(start)
		runtime.KeepAlive(leases)
		_ = c.Close()
		bare, dl = append(bare, tb), append(dl, td)
		ratio = append(ratio, time.Duration(float64(td)/float64(tb)*1000)) // per mille
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(locktest.Median(dl)), "ms/10000")
	b.ReportMetric(ms(locktest.Median(bare)), "driver-ms/10000")
	b.ReportMetric(float64(locktest.Median(ratio))/1000, "vs-driver")
}

// BenchmarkLockUnlockCtx measures an uncontended Lock+Unlock on memlock with
// the context a caller passes: one that is never cancelled (background), a
// cancellable one (cancel) and one with a deadline (timeout), and a TryLock
// (trylock) as the floor: allocs/op and B/op are the core's cost per
// operation, the driver's being a few allocations.
func BenchmarkLockUnlockCtx(b *testing.B) {
	c := dlock.New(memlock.NewBackend().NewDriver(), nil)
	defer c.Close()
	m := c.NewMutex("ctx", nil)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tctx, tcancel := context.WithTimeout(context.Background(), time.Hour)
	defer tcancel()
	for _, bc := range []struct {
		name string
		ctx  context.Context
		try  bool
	}{{"background", context.Background(), false}, {"cancel", cctx, false}, {"timeout", tctx, false},
		{"trylock", context.Background(), true}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var l *dlock.Lease
				var err error
				if bc.try {
					l, err = m.TryLock(bc.ctx)
				} else {
					l, err = m.Lock(bc.ctx)
				}
				if err != nil {
					b.Fatalf("Lock: %v", err)
				}
				if err := l.Unlock(bc.ctx); err != nil {
					b.Fatalf("Unlock: %v", err)
				}
			}
		})
	}
}

// BenchmarkQueuerLockUnlock measures what a Client adds to a driver's
// uncontended Acquire+Release on a Queuer (errQueuer: memlock made a
// Queuer whose calls read their context's Err and Deadline, as a network
// client's requests do, and ask for Done only when they wait), each op
// under a context.WithTimeout of its own as a caller's request would be:
// rounds of the bare driver's calls and of a Client's Lock+Unlock
// alternate, and it reports the medians of the process's CPU time per op
// (background work included) of each, their difference (core-cpu-ns) and
// ratio (client/driver), and allocs/op of the whole run.
//
//	go test -run '^$' -bench QueuerLockUnlock -benchtime 200000x .
func BenchmarkQueuerLockUnlock(b *testing.B) {
	if _, ok := cpuTime(); !ok {
		b.Skip("no process CPU time on this platform")
	}
	d := errQueuer{memlock.NewBackend().NewDriver()}
	c := dlock.New(d, nil)
	defer c.Close()
	m := c.NewMutex("queuer-client", nil)
	req := driver.AcquireRequest{Name: "queuer-driver", Owner: "0123456789abcdefghijkl", TTL: 30 * time.Second}
	ops := []func(){
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			g, err := d.Acquire(ctx, req)
			if err != nil {
				b.Fatalf("Acquire: %v", err)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL}); err != nil {
				b.Fatalf("Release: %v", err)
			}
		},
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l, err := m.Lock(ctx)
			if err != nil {
				b.Fatalf("Lock: %v", err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatalf("Unlock: %v", err)
			}
		},
	}
	const round = 2000
	per := [2][]float64{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < max(b.N/round/2, 5); i++ {
		for j, op := range ops {
			t0, _ := cpuTime()
			for range round {
				op()
			}
			t1, _ := cpuTime()
			per[j] = append(per[j], float64(t1-t0)/round)
		}
	}
	med := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	dn, cn := med(per[0]), med(per[1])
	b.ReportMetric(dn, "driver-cpu-ns")
	b.ReportMetric(cn, "client-cpu-ns")
	b.ReportMetric(cn-dn, "core-cpu-ns")
	b.ReportMetric(cn/dn, "client/driver")
}
