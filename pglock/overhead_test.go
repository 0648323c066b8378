package pglock

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// BenchmarkSameWorkFloor compares TryLock+Unlock with the very statements
// the driver sends, issued bare on one connection. The locktest floors
// leave out work the driver must do (the durable fence increment of the
// session modes, NOTIFY on release); this ratio is the cost of the dlock
// layers alone.
func BenchmarkSameWorkFloor(b *testing.B) {
	for _, mode := range []Mode{ModeLease, ModeAdvisory, ModeRowLock} {
		b.Run(string(mode), func(b *testing.B) {
			ctx := context.Background()
			d, c := benchDriver(b, mode)
			conn, err := d.pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			name := randomName("samework")
			bareName := name + "-bare"
			q := d.q
			bare := func() error {
				switch mode {
				case ModeLease:
					var won bool
					var fence, retry int64
					var count int
					if err := conn.QueryRow(ctx, q.leaseAcquire, bareName, "o", int64(30e6), int64(0)).Scan(&won, &fence, &count, &retry); err != nil {
						return err
					}
					var rem int
					var n *bool
					return conn.QueryRow(ctx, q.leaseRelease, bareName, "o", fence, d.channel, WaitKey(bareName)).Scan(&rem, &n)
				case ModeAdvisory:
					var fence int64
					var old string
					k := AdvisoryKey(bareName)
					if err := conn.QueryRow(ctx, q.advisoryAcquire, k, "30000").Scan(&fence, nil, &old, nil); err != nil {
						return err
					}
					var n *bool
					return conn.QueryRow(ctx, q.advisoryReleaseReset, k, d.channel, bareName, WaitKey(bareName), old).Scan(&n, nil)
				default:
					bt := &pgx.Batch{}
					bt.Queue("BEGIN")
					bt.Queue(q.rowLock, bareName, "30000")
					if err := conn.SendBatch(ctx, bt).Close(); err != nil {
						return err
					}
					var fence int64
					if err := d.pool.QueryRow(ctx, q.fenceBump, bareName, "o").Scan(&fence); err != nil {
						return err
					}
					// The pinned session confirms its row lock after the increment.
					var set string
					if err := conn.QueryRow(ctx, q.rowLock, bareName, "30000").Scan(&set); err != nil {
						return err
					}
					bt = &pgx.Batch{}
					bt.Queue(q.rowNotify, d.channel, bareName, WaitKey(bareName))
					bt.Queue("COMMIT")
					return conn.SendBatch(ctx, bt).Close()
				}
			}
			if mode == ModeRowLock {
				if _, err := conn.Exec(ctx, q.rowEnsure, bareName); err != nil {
					b.Fatal(err)
				}
			}
			sqltest.SameWork(b, c.NewMutex(name, nil), bare)
		})
	}
}

// BenchmarkNativePeer compares TryLock+Unlock (per mode) with what a user
// would write by hand instead of dlock: a blocking pg_advisory_lock and
// pg_advisory_unlock on one connection, interleaved in the same run; the
// metric x-native is dlock's median over the hand-written one's.
func BenchmarkNativePeer(b *testing.B) {
	sqltest.NativePeer(b, []string{"lease", "advisory"}, func(b *testing.B, mode, name string) (*dlock.Mutex, func() error) {
		ctx := context.Background()
		d, c := benchDriver(b, Mode(mode))
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(conn.Release)
		k := AdvisoryKey(name + "-native")
		return c.NewMutex(name, nil), func() error {
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
				return err
			}
			_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", k)
			return err
		}
	})
}

// benchDriver returns a driver in mode on the test server and a client on
// it, both closed when b ends.
func benchDriver(b testing.TB, mode Mode) (*Driver, *dlock.Client) {
	dn, err := newTestHarness(b, mode).NewDriver(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	c := dlock.New(dn, &dlock.Options{TTL: 30 * time.Second})
	b.Cleanup(func() { _ = c.Close() })
	return dn.(*Driver), c
}

// BenchmarkAdvisoryStatements times, interleaved on one connection, the
// hand-written pair (pg_advisory_lock + pg_advisory_unlock) and two bare
// ModeAdvisory statement pairs: a plain try with dlock's release, and
// dlock's acquire of a name used before (the token drawn from the table's
// sequences) with its release. It reports each pair's p50 and its ratio to
// the hand-written one (x-native-*): what the statements cost before any
// dlock layer.
func BenchmarkAdvisoryStatements(b *testing.B) {
	ctx := context.Background()
	d, _ := benchDriver(b, ModeAdvisory)
	if err := d.base.Ready(ctx); err != nil {
		b.Fatal(err)
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	name := randomName("statements")
	k, q := AdvisoryKey(name), d.q
	if _, err := conn.Exec(ctx, q.advisoryAcquireNew, k, "30000", name); err != nil { // the name's row
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		b.Fatal(err)
	}
	exec := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	release := func() error {
		var n *bool
		return conn.QueryRow(ctx, q.advisoryReleaseReset, k, d.channel, name, WaitKey(name), "0").Scan(&n, nil)
	}
	pairs := []struct {
		name string
		run  func() error
	}{
		{"native", func() error {
			if err := exec("SELECT pg_advisory_lock($1)", k); err != nil {
				return err
			}
			return exec("SELECT pg_advisory_unlock($1)", k)
		}},
		{"try", func() error {
			if err := exec("SELECT pg_try_advisory_lock($1)", k); err != nil {
				return err
			}
			return release()
		}},
		{"dlock", func() error {
			if err := conn.QueryRow(ctx, q.advisoryAcquire, k, "30000").Scan(nil, nil, nil, nil); err != nil {
				return err
			}
			return release()
		}},
	}
	times := make([][]time.Duration, len(pairs))
	for i := 0; i < b.N+5; i++ {
		for j, p := range pairs {
			t0 := time.Now()
			if err := p.run(); err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			if i >= 5 {
				times[j] = append(times[j], time.Since(t0))
			}
		}
	}
	p50 := make([]time.Duration, len(pairs))
	for j, ts := range times {
		slices.Sort(ts)
		p50[j] = ts[len(ts)/2]
	}
	for j, p := range pairs {
		b.ReportMetric(float64(p50[j].Nanoseconds())/1e3, p.name+"-p50-µs")
		if j > 0 {
			b.ReportMetric(float64(p50[j])/float64(p50[0]), "x-native-"+p.name)
		}
	}
}
