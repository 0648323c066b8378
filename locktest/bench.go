package locktest

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// RunBenchmarks runs the benchmark scenarios against the backend
// newHarness connects to. Where the harness implements Floors, each result
// is also reported as a ratio to a raw floor measured in the same run, on the
// same kind of connection, interleaved with the measured operation so that
// a noisy machine affects both alike:
//
//   - AcquireRelease: uncontended TryLock+Unlock; metric x-floor.
//   - HotLock/contenders=N: N goroutines over several clients on one lock;
//     metrics ops/s, handoff-p50-µs, handoff-p99-µs and handoff-p50/rtt
//     (hand-off latency from the release to the next holder's grant, over one
//     raw round trip), and retake-% (how often the previous holder took the
//     lock again). The release time is the midpoint of the Unlock round
//     trip, the best estimate of when the server freed the lock.
//
// The measuring itself is done by Interleave and HotLock (measure.go), which
// "dlock bench" and the peer comparison in bench/peers use too.
//   - Wake: release → grant of one waiter blocked on another client;
//     metrics wake-p50-µs and wake-p99-µs (each round lets the waiter settle
//     for WakeSettle first).
//   - ManyLocks: independent locks in parallel.
//   - Renew/leases=N: N held leases (Config.RenewLeases, default 10,000) on
//     one client renewing;
//     metrics renew-calls/tick and bytes/lease.
func RunBenchmarks(b *testing.B, newHarness NewHarness) {
	ctx := context.Background()
	h, err := newHarness(ctx, b)
	if err != nil {
		b.Fatalf("locktest: harness: %v", err)
	}
	b.Cleanup(h.Close)
	cfg := h.Config()
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	s := &suite{h: h, cfg: cfg}
	b.Run("AcquireRelease", s.benchAcquireRelease)
	for _, n := range []int{8, 32} {
		b.Run(fmt.Sprintf("HotLock/contenders=%d", n), func(b *testing.B) { s.benchHotLock(b, n) })
	}
	b.Run("Wake", s.benchWake)
	b.Run(fmt.Sprintf("Fair/contenders=%d", FairContenders), s.benchFair)
	b.Run("ManyLocks", s.benchManyLocks)
	var rs *renewState
	n := cfg.RenewLeases
	if n <= 0 {
		n = 10000
	}
	b.Run(fmt.Sprintf("Renew/leases=%d", n), func(b *testing.B) { s.benchRenew(b, n, &rs) })
	if rs != nil {
		_ = rs.c.Close()
	}
}

func (s *suite) benchClient(b *testing.B, opts *dlock.Options) *dlock.Client {
	b.Helper()
	d, err := s.h.NewDriver(context.Background())
	if err != nil {
		b.Fatalf("NewDriver: %v", err)
	}
	if opts == nil {
		opts = &dlock.Options{TTL: 30 * time.Second}
	}
	c := dlock.New(d, opts)
	b.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *suite) benchAcquireRelease(b *testing.B) {
	ctx := context.Background()
	c := s.benchClient(b, nil)
	name := uniqueName(b)
	m := c.NewMutex(name, nil)
	var floor func(context.Context, string) error
	if f, ok := s.h.(Floors); ok {
		op, cleanup, err := f.AcquireReleaseFloor(ctx)
		if err != nil {
			b.Fatalf("AcquireReleaseFloor: %v", err)
		}
		defer cleanup()
		floor = op
	}
	floorKey := name + "-floor"
	lockOp := func(ctx context.Context) error {
		l, err := m.TryLock(ctx)
		if err != nil {
			return fmt.Errorf("lock: %w", err)
		}
		if err := l.Unlock(ctx); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		return nil
	}
	ops := []func(context.Context) error{lockOp}
	if floor != nil {
		ops = append(ops, func(ctx context.Context) error { return floor(ctx, floorKey) })
	}
	// Warm both paths (scripts loaded, statements prepared, tables created).
	if _, err := Interleave(ctx, Budget{Max: 5}, ops); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	b.ResetTimer()
	ds, err := Interleave(ctx, Budget{Max: b.N}, ops)
	b.StopTimer()
	if err != nil {
		b.Fatalf("%v", err)
	}
	lockP50 := Summarize(ds[0]).P50
	b.ReportMetric(float64(lockP50.Nanoseconds()), "p50-ns/op")
	if floor != nil {
		fm := Summarize(ds[1]).P50
		b.ReportMetric(float64(fm.Nanoseconds()), "floor-p50-ns/op")
		if fm > 0 {
			b.ReportMetric(float64(lockP50)/float64(fm), "x-floor")
		}
	}
}

func (s *suite) benchHotLock(b *testing.B, contenders int) {
	ctx := context.Background()
	name := uniqueName(b)
	const clients = 4
	cs := make([]*dlock.Client, clients)
	for i := range cs {
		cs[i] = s.benchClient(b, &dlock.Options{TTL: 30 * time.Second, WaitMax: 20 * time.Millisecond})
	}
	var rtt time.Duration
	if f, ok := s.h.(Floors); ok {
		op, cleanup, err := f.RoundTripFloor(ctx)
		if err != nil {
			b.Fatalf("RoundTripFloor: %v", err)
		}
		ds, err := Interleave(ctx, Budget{Max: 200}, []func(context.Context) error{op})
		cleanup()
		if err != nil {
			b.Fatalf("round trip: %v", err)
		}
		rtt = Summarize(ds[0]).P50
	}
	lockers := make([]LockFunc, contenders)
	for g := range lockers {
		lockers[g] = MutexLocker(cs[g%clients].NewMutex(name, nil))
	}
	b.ResetTimer()
	r, err := HotLock(ctx, Budget{Max: b.N}, lockers)
	b.StopTimer()
	if err != nil {
		b.Fatalf("hot lock: %v", err)
	}
	b.ReportMetric(r.OpsPerSec(), "ops/s")
	b.ReportMetric(100*r.RetakeShare(), "retake-%")
	ReportHandoffs(b, r.Handoffs, rtt)
}

func (s *suite) benchWake(b *testing.B) {
	ctx := context.Background()
	name := uniqueName(b)
	holder := MutexLocker(s.benchClient(b, nil).NewMutex(name, nil))
	waiter := MutexLocker(s.benchClient(b, nil).NewMutex(name, nil))
	b.ResetTimer()
	ds, err := Wake(ctx, Budget{Max: b.N}, WakeSettle, holder, waiter)
	b.StopTimer()
	if err != nil {
		b.Fatalf("wake: %v", err)
	}
	st := Summarize(ds)
	b.ReportMetric(float64(st.P50)/float64(time.Microsecond), "wake-p50-µs")
	b.ReportMetric(float64(st.P99)/float64(time.Microsecond), "wake-p99-µs")
}

// The fairness scenario of RunBenchmarks (Fair/contenders=9): FairClients
// clients, as separate processes would be, FairContenders goroutines
// spread over them, each holding the lock for FairHold, for FairDuration.
const (
	FairClients    = 3
	FairContenders = 9
	FairHold       = 100 * time.Millisecond
	FairDuration   = 4 * time.Second
)

// benchFair runs Fair for b.N × FairDuration (-benchtime 1x: one run of
// FairDuration; the default benchtime, 1s, also ends after one) and reports the longest Lock wait, the 99th percentile and median of the
// waits that ended in a grant, the grants, the fewest any goroutine got and
// the re-take share.
func (s *suite) benchFair(b *testing.B) {
	ctx := context.Background()
	name := uniqueName(b)
	cs := make([]*dlock.Client, FairClients)
	for i := range cs {
		cs[i] = s.benchClient(b, nil)
	}
	lockers := make([]LockFunc, FairContenders)
	for g := range lockers {
		lockers[g] = MutexLocker(cs[g%FairClients].NewMutex(name, nil))
	}
	b.ResetTimer()
	r, err := Fair(ctx, time.Duration(b.N)*FairDuration, FairHold, lockers)
	b.StopTimer()
	if err != nil {
		b.Fatalf("fair: %v", err)
	}
	st := Summarize(r.Waits)
	b.ReportMetric(float64(r.MaxWait.Milliseconds()), "max-wait-ms")
	b.ReportMetric(float64(st.P99.Milliseconds()), "wait-p99-ms")
	b.ReportMetric(float64(st.P50.Milliseconds()), "wait-p50-ms")
	b.ReportMetric(float64(len(r.Seq)), "grants")
	b.ReportMetric(float64(slices.Min(r.PerGoroutine(FairContenders))), "min-grants")
	b.ReportMetric(100*r.RetakeShare(), "retake-%")
}

// MutexLocker is the LockFunc of m: Lock, and the lease's Unlock.
func MutexLocker(m *dlock.Mutex) LockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		l, err := m.Lock(ctx)
		if err != nil {
			return nil, err
		}
		return l.Unlock, nil
	}
}

// ReportHandoffs reports hand-off latencies as the metrics handoff-p50-µs,
// handoff-p99-µs and, when rtt is known, handoff-p50/rtt (the median over one
// raw round trip), so that benchmarks of other lock implementations (e.g. a
// backend's native lock, measured beside dlock's) print comparable numbers.
// It sorts handoffs in place.
func ReportHandoffs(b *testing.B, handoffs []time.Duration, rtt time.Duration) {
	if len(handoffs) == 0 {
		return
	}
	sort.Slice(handoffs, func(i, j int) bool { return handoffs[i] < handoffs[j] })
	p50 := handoffs[len(handoffs)/2]
	p99 := handoffs[min(len(handoffs)-1, len(handoffs)*99/100)]
	b.ReportMetric(float64(p50.Microseconds()), "handoff-p50-µs")
	b.ReportMetric(float64(p99.Microseconds()), "handoff-p99-µs")
	if rtt > 0 {
		b.ReportMetric(float64(p50)/float64(rtt), "handoff-p50/rtt")
	}
}

// Median returns the median of ds without changing ds (0 for none).
func Median(ds []time.Duration) time.Duration { return median(ds) }

func (s *suite) benchManyLocks(b *testing.B) {
	ctx := context.Background()
	c := s.benchClient(b, nil)
	base := uniqueName(b)
	var seq atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		m := c.NewMutex(fmt.Sprintf("%s-%d", base, seq.Add(1)), nil)
		for pb.Next() {
			l, err := m.TryLock(ctx)
			if err != nil {
				b.Errorf("TryLock: %v", err)
				return
			}
			if err := l.Unlock(ctx); err != nil {
				b.Errorf("Unlock: %v", err)
				return
			}
		}
	})
}

// countingDriver counts Renew calls; only TryAcquire, Release and Renew
// pass through, which is all this benchmark uses.
type countingDriver struct {
	driver.Driver
	renews atomic.Int64
}

func (d *countingDriver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	d.renews.Add(1)
	return d.Driver.Renew(ctx, ls)
}

// renewState is set up once and reused across the b.N rounds the testing
// package asks for, since taking 10,000 leases is the slow part.
type renewState struct {
	c          *dlock.Client
	cd         *countingDriver
	leases     []*dlock.Lease
	every      time.Duration
	bytesPer   float64
	acquireDur time.Duration
}

func (s *suite) renewSetup(b *testing.B, n int) *renewState {
	ctx := context.Background()
	d, err := s.h.NewDriver(ctx)
	if err != nil {
		b.Fatalf("NewDriver: %v", err)
	}
	rs := &renewState{cd: &countingDriver{Driver: d}}
	ttl := max(s.cfg.TTL, 2*time.Second)
	rs.every = ttl / 4
	rs.c = dlock.New(rs.cd, &dlock.Options{TTL: ttl, RenewInterval: rs.every})
	base := uniqueName(b)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rs.leases = make([]*dlock.Lease, 0, n)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		l, err := rs.c.NewMutex(fmt.Sprintf("%s-%d", base, i), nil).TryLock(ctx)
		if err != nil {
			_ = rs.c.Close()
			b.Fatalf("TryLock %d: %v", i, err)
		}
		rs.leases = append(rs.leases, l)
	}
	rs.acquireDur = time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&after)
	rs.bytesPer = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	// Let renewals fall into step (the leases were taken over acquireDur).
	settle := time.NewTimer(2 * rs.every)
	<-settle.C
	return rs
}

func (s *suite) benchRenew(b *testing.B, n int, state **renewState) {
	b.StopTimer()
	if *state == nil {
		*state = s.renewSetup(b, n)
	}
	rs := *state
	calls0 := rs.cd.renews.Load()
	t0 := time.Now()
	b.StartTimer()
	// The metrics are per tick; more than a few ticks add only time (and
	// -benchtime=Nx would otherwise mean N renewal intervals).
	for i := 0; i < min(b.N, 8); i++ {
		tick := time.NewTimer(rs.every)
		<-tick.C
	}
	b.StopTimer()
	ticks := float64(time.Since(t0)) / float64(rs.every)
	calls := rs.cd.renews.Load() - calls0
	lost := 0
	for _, l := range rs.leases {
		if l.Err() != nil {
			lost++
		}
	}
	if lost > 0 {
		b.Fatalf("%d of %d leases lost while renewing", lost, n)
	}
	b.ReportMetric(float64(calls)/ticks, "renew-calls/tick")
	b.ReportMetric(rs.bytesPer, "bytes/lease")
	b.ReportMetric(rs.acquireDur.Seconds()*1e6/float64(n), "acquire-µs/lease")
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	c := append([]time.Duration(nil), ds...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c[len(c)/2]
}
