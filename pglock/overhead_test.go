package pglock

import (
	"context"
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
