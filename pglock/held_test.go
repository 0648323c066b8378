package pglock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/locktest"
)

// BenchmarkManyHeld times an unrelated TryLock+Unlock on a ModeLease
// client that holds none, then 10,000 leases (TTL 3 s, so a renewal of all
// of them runs every second while it is timed), interleaved at each level
// with the hand-written floor (blocking pg_advisory_lock and
// pg_advisory_unlock on one connection). x-held is dlock's p50 with 10,000
// held over its p50 with none; x-held-floor divides each by the floor's p50
// of the same level, which takes out a change of the machine's load
// between the levels. acquire-µs/lease is the mean time to take one of the
// 10,000. Run it with -benchtime 1x: each round takes the 10,000 anew.
func BenchmarkManyHeld(b *testing.B) {
	ctx := context.Background()
	const held = 10000
	probe := 3 * time.Second
	for i := 0; i < b.N; i++ {
		d, _ := benchDriver(b, ModeLease)
		c := dlock.New(d, &dlock.Options{TTL: 3 * time.Second})
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		base := randomName("held")
		k := AdvisoryKey(base + "-native")
		floor := func(ctx context.Context) error {
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
				return err
			}
			_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", k)
			return err
		}
		m := c.NewMutex(base+"-probe", nil)
		op := func(ctx context.Context) error {
			l, err := m.TryLock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		}
		level := func() (dl, fl time.Duration) {
			ds, err := locktest.Interleave(ctx, locktest.Budget{Duration: probe}, []func(context.Context) error{op, floor})
			if err != nil {
				b.Fatal(err)
			}
			return locktest.Summarize(ds[0]).P50, locktest.Summarize(ds[1]).P50
		}
		d0, f0 := level()
		leases := make([]*dlock.Lease, 0, held)
		t0 := time.Now()
		for j := 0; j < held; j++ {
			l, err := c.NewMutex(fmt.Sprintf("%s-%d", base, j), nil).TryLock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			leases = append(leases, l)
		}
		acquire := time.Since(t0) / held
		d1, f1 := level()
		for _, l := range leases {
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
		conn.Release()
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(us(d0), "held-0-µs")
		b.ReportMetric(us(d1), "held-10000-µs")
		b.ReportMetric(us(f0), "floor-0-µs")
		b.ReportMetric(us(f1), "floor-10000-µs")
		b.ReportMetric(float64(d1)/float64(d0), "x-held")
		b.ReportMetric(float64(d1)/float64(f1)/(float64(d0)/float64(f0)), "x-held-floor")
		b.ReportMetric(us(acquire), "acquire-µs/lease")
	}
}

// BenchmarkRenewMany times one Renew of 10,000 held leases (ModeLease, one
// UPDATE … FROM unnest(…)), the statement a Client holding that many sends
// every TTL/3, and reports how many bytes the lock table and its index
// grew per renewal (growth-B/renew): rows rewritten off their pages mean
// new index entries and more pages for every later statement to read.
// Each round takes the 10,000 anew on a table of its own.
func BenchmarkRenewMany(b *testing.B) {
	ctx := context.Background()
	const held = 10000
	for i := 0; i < b.N; i++ {
		pool := newPool(b)
		table := fmt.Sprintf("dlock_bench_renew%d", i)
		for _, s := range []string{table, table + "_kinds", table + "_holders"} {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+s); err != nil {
				b.Fatal(err)
			}
		}
		d, err := New(pool, &Options{Table: table})
		if err != nil {
			b.Fatal(err)
		}
		base := randomName("renew")
		ls := make([]driver.Lease, 0, held)
		for j := 0; j < held; j++ {
			req := driver.AcquireRequest{Name: fmt.Sprintf("%s-%d", base, j), Owner: "owner-renew", TTL: time.Minute}
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			ls = append(ls, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, TTL: req.TTL})
		}
		size := func() int64 {
			var n int64
			if err := pool.QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass)", table).Scan(&n); err != nil {
				b.Fatal(err)
			}
			return n
		}
		const rounds = 5
		s0 := size()
		var ds []time.Duration
		for r := 0; r < rounds; r++ {
			t0 := time.Now()
			errs, err := d.Renew(ctx, ls)
			ds = append(ds, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
			for _, e := range errs {
				if e != nil {
					b.Fatal(e)
				}
			}
		}
		grew := size() - s0
		_ = d.Close()
		for _, s := range []string{table, table + "_kinds", table + "_holders"} {
			if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+s); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(locktest.Summarize(ds).P50.Microseconds())/1e3, "renew-p50-ms")
		b.ReportMetric(float64(grew)/rounds, "growth-B/renew")
	}
}

// newPool returns a pool on the test server, closed when tb ends.
func newPool(tb testing.TB) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), serverURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
