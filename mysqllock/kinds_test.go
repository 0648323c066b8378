package mysqllock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/locktest"
)

var _ locktest.KindDropper = (*harness)(nil)

func leaseOpener(t *testing.T) sqltest.Open { return newTestHarness(t, ModeLease).NewDriver }

func TestKinds(t *testing.T)     { sqltest.Kinds(t, leaseOpener(t)) }
func TestKindWakes(t *testing.T) { sqltest.KindWakes(t, leaseOpener(t)) }

func TestReadersWakeTogether(t *testing.T) { sqltest.ReadersWakeTogether(t, leaseOpener(t)) }

func TestWithdrawWakes(t *testing.T) { sqltest.WithdrawWakes(t, leaseOpener(t)) }
func TestMulti(t *testing.T)         { sqltest.Multi(t, leaseOpener(t)) }
func TestRaiseFence(t *testing.T)    { sqltest.RaiseFence(t, leaseOpener(t)) }

// TestSessionModesRefuseKinds: the session modes hold mutexes only; a
// kind asked of them directly is refused with ErrUnsupported, as is a
// multi-acquire, and never granted as a mutex. Their mutex fence can be
// raised.
const kindTTL = 10 * time.Second

func TestSessionModesRefuseKinds(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			dn, err := newTestHarness(t, mode).NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer dn.Close()
			d := dn.(*Driver)
			name := randomName("sessionkinds")
			for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
				if d.SupportsKind(k) {
					t.Errorf("SupportsKind(%s) in mode %s", k, mode)
				}
				_, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "a", TTL: kindTTL, Kind: k, Permits: 1})
				if !errors.Is(err, driver.ErrUnsupported) {
					t.Errorf("TryAcquire %s in mode %s: %v, want ErrUnsupported", k, mode, err)
				}
			}
			if _, err := d.TryAcquireMulti(ctx, []driver.AcquireRequest{{Name: name, Owner: "a", TTL: kindTTL}}); !errors.Is(err, driver.ErrUnsupported) {
				t.Errorf("TryAcquireMulti in mode %s: %v, want ErrUnsupported", mode, err)
			}
			if err := d.RaiseFence(ctx, name, driver.Exclusive, 99); err != nil {
				t.Fatal(err)
			}
			g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "a", TTL: kindTTL})
			if err != nil {
				t.Fatal(err)
			}
			if g.Token != 100 {
				t.Errorf("token %d after a raise to 99, want 100", g.Token)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "a", Token: g.Token, Handle: g.Handle, TTL: kindTTL}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMigratesOldTable opens a lock table an older version made (no
// fence_floor column, no kinds tables), twice: the schema is brought up to
// date in place, the old row keeps its fence, raising works, and the
// second open changes nothing.
func TestMigratesOldTable(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeLease)
	table := "dlock_old_" + strings.ReplaceAll(randomName("m")[2:], "-", "")
	if _, err := h.admin.ExecContext(ctx, "CREATE TABLE "+table+" ("+
		"name VARBINARY(255) NOT NULL PRIMARY KEY, "+
		"owner VARBINARY(128) NOT NULL DEFAULT '', "+
		"`count` INT NOT NULL DEFAULT 0, "+
		"fence BIGINT UNSIGNED NOT NULL DEFAULT 0, "+
		"lock_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', "+
		"delay_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', "+
		"version BIGINT UNSIGNED NOT NULL DEFAULT 0) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = h.admin.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+table+", "+table+"_kinds, "+table+"_holders")
	})
	if _, err := h.admin.ExecContext(ctx, "INSERT INTO "+table+" (name, fence) VALUES ('old', 41)"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint64{42, 44} {
		dn, err := OpenURL(ctx, sqltest.ModeURL(h.base, string(ModeLease), table))
		if err != nil {
			t.Fatal(err)
		}
		r := driver.AcquireRequest{Name: "old", Owner: "a", TTL: kindTTL}
		g, err := dn.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if g.Token != want {
			t.Fatalf("open %d: token %d, want %d", i, g.Token, want)
		}
		if _, err := dn.Release(ctx, driver.Lease{Name: "old", Owner: "a", Token: g.Token, TTL: kindTTL}); err != nil {
			t.Fatal(err)
		}
		if err := dn.(driver.FenceRaiser).RaiseFence(ctx, "old", driver.Exclusive, g.Token+1); err != nil {
			t.Fatal(err)
		}
		if _, err := dn.TryAcquire(ctx, driver.AcquireRequest{Name: "old", Owner: "a", TTL: kindTTL, Kind: driver.Read}); err != nil {
			t.Fatal(err)
		}
		dn.Close()
	}
}

// TestGrantKeys: every grant names its row (see sqlcommon.GrantKey), in
// every mode.
func TestGrantKeys(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			sqltest.GrantKeys(t, newTestHarness(t, mode).NewDriver, func(d driver.Driver) string { return d.(*Driver).table })
		})
	}
}

func TestKindLockDelayInspect(t *testing.T) { sqltest.KindLockDelayInspect(t, leaseOpener(t)) }
