package mysqllock

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// BenchmarkSameWorkFloor compares TryLock+Unlock with the very statements
// the driver sends, issued bare on one connection: the cost of the dlock
// layers alone (the locktest floors leave out the driver's durable fence
// increment in the session modes).
func BenchmarkSameWorkFloor(b *testing.B) {
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
		b.Run(string(mode), func(b *testing.B) {
			ctx := context.Background()
			d, c := benchDriver(b, mode)
			conn, err := d.db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			name := randomName("samework")
			bare := name + "-bare"
			k, o, l, w := hexLit(bare), hexLit("o"), hexLit(LockName(bare)), hexLit(SignalName(bare))
			q := d.q
			ttl := strconv.FormatInt(sqlcommon.Micros(30*time.Second), 10)
			exec := func(s string) (int64, error) {
				res, err := conn.ExecContext(ctx, s)
				if err != nil {
					return 0, err
				}
				return res.LastInsertId()
			}
			if mode == ModeRowLock {
				if _, err := exec(fill(q.rowEnsure, "{K}", k)); err != nil {
					b.Fatal(err)
				}
			}
			op := func() error {
				switch mode {
				case ModeLease:
					id, err := exec(fill(q.leaseAcquire, "{K}", k, "{O}", o, "{TTL}", ttl, "{TTLD}", ttl))
					if err != nil {
						return err
					}
					_, err = exec(fill(q.leaseRelease, "{K}", k, "{O}", o, "{F}", strconv.FormatUint(uint64(id)>>countBits, 10)))
					return err
				case ModeGetLock:
					if _, err := exec(fill(q.getLock, "{L}", l, "{W}", w, "{WT}", "30")); err != nil {
						return err
					}
					if _, err := exec(fill(q.fenceInsert, "{K}", k, "{O}", o, "{L}", l)); err != nil {
						return err
					}
					_, err := exec(fill(q.getLockRelease, "{L}", l, "{W}", w))
					return err
				default:
					if _, err := exec("SET autocommit = 0, SESSION wait_timeout = 30"); err != nil {
						return err
					}
					var one int
					if err := conn.QueryRowContext(ctx, fill(q.rowLock, "{K}", k)).Scan(&one); err != nil {
						return err
					}
					if _, err := d.db.ExecContext(ctx, fill(q.fenceBump, "{K}", k, "{O}", o)); err != nil {
						return err
					}
					// The pinned session confirms its row lock after the increment.
					var signal *int
					if err := conn.QueryRowContext(ctx, fill(q.rowConfirm, "{K}", k, "{W}", w)).Scan(&signal); err != nil {
						return err
					}
					_, err := exec(fill(q.rowRelease, "{W}", w))
					return err
				}
			}
			sqltest.SameWork(b, c.NewMutex(name, nil), op)
		})
	}
}

// BenchmarkNativePeer compares TryLock+Unlock (per mode) with what a user
// would write by hand instead of dlock: a blocking GET_LOCK and RELEASE_LOCK
// on one connection, interleaved in the same run; the metric x-native is
// dlock's median over the hand-written one's.
func BenchmarkNativePeer(b *testing.B) {
	sqltest.NativePeer(b, []string{"lease", "getlock"}, func(b *testing.B, mode, name string) (*dlock.Mutex, func() error) {
		ctx := context.Background()
		d, c := benchDriver(b, Mode(mode))
		conn, err := d.db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = conn.Close() })
		// Literal text, one round trip each (placeholders would cost a
		// prepare and a close per call without interpolateParams).
		k := hexLit(LockName(name + "-native"))
		return c.NewMutex(name, nil), func() error {
			var ok int
			if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+k+", 10)").Scan(&ok); err != nil {
				return err
			}
			return conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+k+")").Scan(&ok)
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
