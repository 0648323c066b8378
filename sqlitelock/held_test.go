package sqlitelock

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/locktest"
)

// BenchmarkLockUnlockHeld: the cost of one Lock+Unlock of an unrelated name
// on a client that holds N leases, against the same on a client of another
// database file that holds none, interleaved round-robin in one run so that
// a noisy machine hits both alike. Metrics: p50-held-µs, p50-none-µs and
// x-none, their ratio (issue #13 asks for ≤ 1.25 at N = 10,000; held=0 shows
// the ratio with nothing held anywhere, about 1). Each lease taken on the
// one database is also taken and released on the other. The leases are
// taken once, level by level, and kept across the sub-benchmarks' runs;
// taking 10,000 costs several seconds.
func BenchmarkLockUnlockHeld(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	open := func(file string) *dlock.Client {
		d, err := openPath(ctx, filepath.Join(dir, file), nil)
		if err != nil {
			b.Fatal(err)
		}
		c := dlock.New(d, nil)
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	none, many := open("none.db"), open("held.db")
	var held []*dlock.Lease
	b.Cleanup(func() {
		for _, l := range held {
			_ = l.Unlock(context.Background())
		}
	})
	op := func(c *dlock.Client) func(context.Context) error {
		m := c.NewMutex("probe", nil)
		return func(ctx context.Context) error {
			l, err := m.Lock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		}
	}
	ops := []func(context.Context) error{op(many), op(none)}
	levels := []int{0, 1000, 10000}
	if raceEnabled {
		levels = []int{0, 1000}
	}
	for _, n := range levels {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			for len(held) < n {
				name := fmt.Sprintf("held-%d", len(held))
				l, err := many.NewMutex(name, nil).Lock(ctx)
				if err != nil {
					b.Fatalf("hold %d: %v", len(held), err)
				}
				held = append(held, l)
				// The same writes on the other database, released at
				// once: both have the same rows and write-ahead log
				// behind them, so that only the held leases differ.
				if l, err = none.NewMutex(name, nil).Lock(ctx); err == nil {
					err = l.Unlock(ctx)
				}
				if err != nil {
					b.Fatalf("lock %d on the other database: %v", len(held), err)
				}
			}
			ds := locktest.InterleaveN(ctx, b, 10, ops)
			h, z := locktest.Summarize(ds[0]).P50, locktest.Summarize(ds[1]).P50
			b.ReportMetric(float64(h.Nanoseconds())/1e3, "p50-held-µs")
			b.ReportMetric(float64(z.Nanoseconds())/1e3, "p50-none-µs")
			if z > 0 {
				b.ReportMetric(float64(h)/float64(z), "x-none")
			}
		})
	}
}

// BenchmarkSignalHeld: the wake-up signal's share of a Lock+Unlock (grant,
// release: the byte lock, its release and the waiters probe) of one name
// while the same driver's signal keeps N other names' bytes, against the
// same on a signal of another database that keeps none, interleaved.
// Metrics: held-ns, none-ns and x-none. No database statement is timed, so
// this is the part the companion file's layout decides.
func BenchmarkSignalHeld(b *testing.B) {
	dir := b.TempDir()
	many, none := newSignal(filepath.Join(dir, "held.db")), newSignal(filepath.Join(dir, "none.db"))
	if many == nil || none == nil {
		b.Skip("no wake-up signals on this system")
	}
	defer many.close()
	defer none.close()
	held := 0
	for _, n := range []int{0, 1000, 10000} {
		b.Run(fmt.Sprintf("held=%d", n), func(b *testing.B) {
			for ; held < n; held++ {
				many.grant(fmt.Sprintf("held-%d", held), "o")
			}
			ops := []func(context.Context) error{
				func(context.Context) error { many.grant("probe", "p"); many.released("probe", "p"); return nil },
				func(context.Context) error { none.grant("probe", "p"); none.released("probe", "p"); return nil },
			}
			ds := locktest.InterleaveN(context.Background(), b, 0, ops)
			h, z := locktest.Summarize(ds[0]).P50, locktest.Summarize(ds[1]).P50
			b.ReportMetric(float64(h.Nanoseconds()), "held-ns")
			b.ReportMetric(float64(z.Nanoseconds()), "none-ns")
			if z > 0 {
				b.ReportMetric(float64(h)/float64(z), "x-none")
			}
		})
	}
}
