package pglock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testwait"
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

const kindTTL = 10 * time.Second

// TestSessionModesRefuseKinds: the session modes hold mutexes and
// read/write locks, not semaphores; a Permit asked of them directly is
// refused with ErrUnsupported, as is a multi-acquire, and never granted as
// a mutex. Their mutex fence can be raised.
func TestSessionModesRefuseKinds(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			dn, err := newTestHarness(t, mode).NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer dn.Close()
			d := dn.(*Driver)
			name := randomName("sessionkinds")
			for _, k := range []driver.Kind{driver.Permit} {
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

// TestSessionRW: in the session modes readers share (in one driver and
// across drivers), a writer excludes them and other writers, tokens follow
// the read/write rule, a refused waiting writer's mark holds new readers
// back until Withdraw, a reader's backend terminated from outside frees
// its share, and Inspect reports the lock.
func TestSessionRW(t *testing.T) {
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) { testSessionRW(t, mode) })
	}
}

func testSessionRW(t *testing.T, mode Mode) {
	ctx := context.Background()
	h := newTestHarness(t, mode)
	d, d2 := h.openDriver(t), h.openDriver(t)
	name := randomName("advrw")
	rq := func(owner string, k driver.Kind) driver.AcquireRequest {
		return driver.AcquireRequest{Name: name, Owner: owner, TTL: kindTTL, Kind: k}
	}
	try := func(d *Driver, r driver.AcquireRequest) (driver.Grant, error) { return d.TryAcquire(ctx, r) }
	must := func(d *Driver, r driver.AcquireRequest) driver.Grant {
		t.Helper()
		g, err := try(d, r)
		if err != nil {
			t.Fatalf("%s by %s: %v", r.Kind, r.Owner, err)
		}
		return g
	}
	locked := func(d *Driver, r driver.AcquireRequest) {
		t.Helper()
		if _, err := try(d, r); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("%s by %s: %v, want ErrLocked", r.Kind, r.Owner, err)
		}
	}
	rel := func(d *Driver, r driver.AcquireRequest, g driver.Grant, want int) {
		t.Helper()
		n, err := d.Release(ctx, driver.Lease{Name: name, Owner: r.Owner, Token: g.Token, Handle: g.Handle, TTL: r.TTL, Kind: r.Kind})
		if err != nil || n != want {
			t.Fatalf("release %s by %s: %d, %v", r.Kind, r.Owner, n, err)
		}
	}
	ra, rb, rc, w := rq("a", driver.Read), rq("b", driver.Read), rq("c", driver.Read), rq("w", driver.Write)
	ga, gb, gc := must(d, ra), must(d, rb), must(d2, rc)
	ga2 := must(d, ra)
	if ga2.Count != 2 || ga2.Token != ga.Token {
		t.Fatalf("read re-entry: %+v after %+v", ga2, ga)
	}
	rel(d, ra, ga2, 1)
	locked(d2, w)
	// A waiting writer's mark holds new readers back, not those in.
	ww := w
	ww.Waiting = true
	locked(d2, ww)
	locked(d2, rq("e", driver.Read))
	if err := d2.Withdraw(ctx, ww); err != nil {
		t.Fatal(err)
	}
	ge := must(d2, rq("e", driver.Read))
	rel(d2, rq("e", driver.Read), ge, 0)
	rel(d, ra, ga, 0)
	rel(d, rb, gb, 0)
	// A reader whose backend dies frees its share.
	pids := d2.holderPIDs(name, driver.Read)
	if len(pids) != 1 {
		t.Fatalf("%d reader connections in d2, want 1", len(pids))
	}
	if err := terminate(ctx, h.admin, pids[0]); err != nil {
		t.Fatal(err)
	}
	var gw driver.Grant
	testwait.Until(t, 15*time.Second, "the writer's grant once the last reader's backend ended", func() bool {
		g, err := try(d2, w)
		gw = g
		return err == nil
	})
	locked(d, ra)
	locked(d, rq("x", driver.Write))
	if infos, err := d.Inspect(ctx, name); err != nil || len(infos) != 1 || infos[0].Count != 1 || infos[0].Readers != 0 {
		t.Fatalf("Inspect with a writer: %+v, %v", infos, err)
	}
	if gw.Token <= gc.Token || gc.Token <= max(ga.Token, gb.Token) {
		t.Fatalf("tokens a %d b %d c %d then write %d", ga.Token, gb.Token, gc.Token, gw.Token)
	}
	rel(d2, w, gw, 0)
	ga = must(d, ra)
	if ga.Token <= gw.Token {
		t.Fatalf("read token %d after write %d", ga.Token, gw.Token)
	}
	gb = must(d2, rb)
	infos, err := d.Inspect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	readers := 2
	if mode == ModeRowLock {
		readers = 0 // shared row locks are not seen
	}
	if len(infos) != 1 || infos[0].Kind != driver.Write || infos[0].Readers != readers || infos[0].Token != gb.Token {
		t.Fatalf("Inspect with 2 readers: %+v", infos)
	}
	rel(d, ra, ga, 0)
	rel(d2, rb, gb, 0)
	if infos, err = d.Inspect(ctx, name); err != nil || len(infos) != 1 || infos[0].Readers != 0 || infos[0].Count != 0 {
		t.Fatalf("Inspect when free: %+v, %v", infos, err)
	}
}

func TestSessionKindWakes(t *testing.T) {
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			sqltest.KindWakes(t, newTestHarness(t, mode).NewDriver, driver.Write, driver.Read)
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
	if _, err := h.admin.Exec(ctx, `CREATE TABLE `+table+` (
	name        text PRIMARY KEY,
	owner       text NOT NULL DEFAULT '',
	count       integer NOT NULL DEFAULT 0,
	fence       bigint NOT NULL DEFAULT 0,
	lock_until  timestamptz NOT NULL DEFAULT '-infinity',
	delay_until timestamptz NOT NULL DEFAULT '-infinity',
	version     bigint NOT NULL DEFAULT 0
)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = h.admin.Exec(context.Background(), `DROP TABLE IF EXISTS `+table+`, `+table+`_kinds, `+table+`_holders`)
	})
	if _, err := h.admin.Exec(ctx, `INSERT INTO `+table+` (name, fence) VALUES ('old', 41)`); err != nil {
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
	for _, mode := range []Mode{ModeLease, ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			sqltest.GrantKeys(t, newTestHarness(t, mode).NewDriver, func(d driver.Driver) string { return d.(*Driver).table })
		})
	}
}

func TestKindLockDelayInspect(t *testing.T) { sqltest.KindLockDelayInspect(t, leaseOpener(t)) }
