package sqlitelock

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/locktest"
)

func TestConformance(t *testing.T) { locktest.RunConformanceTests(t, newHarness) }

func BenchmarkLocks(b *testing.B) {
	locktest.RunBenchmarks(b, func(ctx context.Context, tb testing.TB) (locktest.Harness, error) {
		h, err := newHarness(ctx, tb)
		if err != nil {
			return nil, err
		}
		// Only the 10,000-lease renewal benchmark uses the TTL. One renewal
		// of them all rewrites every row: 50-100ms on an idle machine, over
		// a second on a loaded 2-core one, and seconds under -race, so the
		// benchmark's 2s minimum would lose leases to CPU starvation alone.
		h.(*harness).ttl = 5 * time.Second
		if raceEnabled {
			h.(*harness).ttl = 30 * time.Second
		}
		return h, nil
	})
}

// harness runs the suite on one temporary database file. Every driver it
// makes opens the file anew, as another process would.
type harness struct {
	path  string
	admin *Driver       // for Drop
	ttl   time.Duration // Config.TTL; zero means the suite's default (1s)
}

var (
	_ locktest.Harness     = (*harness)(nil)
	_ locktest.Floors      = (*harness)(nil)
	_ locktest.KindDropper = (*harness)(nil)
)

func newHarness(ctx context.Context, t testing.TB) (locktest.Harness, error) {
	path := filepath.Join(t.TempDir(), "locks.db")
	admin, err := openPath(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	h := &harness{path: path, admin: admin}
	if raceEnabled {
		// Under -race SQLite is some 30 times slower; while the whole
		// `make test` runs beside it, one grant can take most of a 1s TTL
		// (and is then rightly refused as arriving past its validity).
		h.ttl = 2 * time.Second
	}
	return h, nil
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	return openPath(ctx, h.path, nil)
}

// Kill closes the driver's database without releasing anything: the rows
// stay until they expire, as after a crash. Later calls fail.
func (h *harness) Kill(d driver.Driver) error {
	sd, ok := d.(*Driver)
	if !ok {
		return fmt.Errorf("Kill: %T is not a *sqlitelock.Driver", d)
	}
	return sd.Close()
}

// Drop expires the current grant on name now, as if its TTL had run out:
// the fence is untouched and the grant's lock-delay, if any, still runs.
func (h *harness) Drop(ctx context.Context, name string) error {
	_, err := h.admin.db.ExecContext(ctx, `UPDATE `+DefaultTable+` SET
	lock_until = n.now, delay_until = n.now + (delay_until - lock_until)
FROM (SELECT `+nowMS+` AS now) AS n
WHERE name = ?1 AND count > 0 AND lock_until > n.now`, name)
	return err
}

// DropKind forgets the current grants of kind k on name with no
// lock-delay: a mutex's lease ends now; readers', a writer's or permits'
// rows are deleted. Counters and stored permit counts stay.
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	if k == driver.Exclusive {
		_, err := h.admin.db.ExecContext(ctx, `UPDATE `+DefaultTable+` SET lock_until = `+nowMS+`, delay_until = `+nowMS+`
WHERE name = ?1 AND count > 0`, name)
		return err
	}
	_, err := h.admin.db.ExecContext(ctx, `DELETE FROM `+h.admin.holders+` WHERE name = ?1 AND grp = ?2 AND kind = ?3`,
		name, sqlcommon.Group(k), sqlcommon.HolderKind(k))
	return err
}

func (h *harness) Config() locktest.Config {
	return locktest.Config{LockDelay: true, TTL: h.ttl} // 3 clients: the default
}

func (h *harness) Close() { h.admin.Close() }

// AcquireReleaseFloor: two bare write transactions (INSERT OR REPLACE, then
// DELETE) on a connection to the same file, opened as a driver opens it.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	d, err := openPath(ctx, h.path, nil)
	if err != nil {
		return nil, nil, err
	}
	op, cleanup, err := acquireReleaseFloor(ctx, d.db)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return op, func() { cleanup(); d.Close() }, nil
}

// RoundTripFloor: SELECT 1 on a connection to the same file.
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	d, err := openPath(ctx, h.path, nil)
	if err != nil {
		return nil, nil, err
	}
	st, err := d.db.PrepareContext(ctx, `SELECT 1`)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	op := func(ctx context.Context) error {
		var one int
		return st.QueryRowContext(ctx).Scan(&one)
	}
	return op, func() { st.Close(); d.Close() }, nil
}
