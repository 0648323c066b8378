package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testwait"
)

// BenchmarkWakeFair reports wake-up latency, the re-take share under 8
// contenders and the longest wait with 9 (see sqltest.WakeFair). Run with
// -benchtime=50x or so: each run takes some 6s whatever b.N.
func BenchmarkWakeFair(b *testing.B) {
	sqltest.WakeFairModes(b, []string{"lease", "getlock"}, openMode)
}

// TestWakesOnRelease: in every mode a release wakes a waiter on another
// driver long before its next poll.
func TestWakesOnRelease(t *testing.T) {
	sqltest.WakesOnReleaseModes(t, []string{"lease", "getlock", "rowlock"}, openMode)
}

func openMode(tb testing.TB, mode string) sqltest.Open {
	return newTestHarness(tb, Mode(mode)).NewDriver
}

// TestLeaseSignal: a lease-mode grant of a contended lock keeps its wake-up
// signal on the server, and the release returns only once the signal is
// given up, so a waiter is woken before the releaser can come back for
// the lock.
func TestLeaseSignal(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeLease)
	var ds []*Driver
	for i := 0; i < 2; i++ {
		d, err := h.NewDriver(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds = append(ds, d.(*Driver))
	}
	name := randomName("signal")
	used := func() bool {
		var id sql.NullInt64
		if err := h.admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK("+hexLit(SignalName(name))+")").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id.Valid
	}
	req := driver.AcquireRequest{Name: name, Owner: "a", TTL: time.Minute}
	ga, err := ds[0].TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	reqB := driver.AcquireRequest{Name: name, Owner: "b", TTL: time.Minute}
	if _, err := ds[1].TryAcquire(ctx, reqB); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("b's acquire of a held lock: %v", err)
	}
	testwait.Until(t, 10*time.Second, "the holder's signal kept", used)
	if _, err := ds[0].Release(ctx, driver.Lease{Name: name, Owner: "a", Token: ga.Token}); err != nil {
		t.Fatal(err)
	}
	if used() {
		t.Fatal("the signal is still kept after the release returned")
	}
	// b was refused the lock a moment ago: its grant is contended and
	// takes the signal at once.
	gb, err := ds[1].TryAcquire(ctx, reqB)
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the new holder's signal kept", used)
	if _, err := ds[1].Release(ctx, driver.Lease{Name: name, Owner: "b", Token: gb.Token}); err != nil {
		t.Fatal(err)
	}
	if used() {
		t.Fatal("the signal is still kept after the second release returned")
	}
}

// TestSignalsSparePool: waiters never take the connections their own
// attempts need. With a pool of 4, one name may be watched at a time (a
// second Subscribe fails, and its Lock polls); with a pool of 2 a
// lease-mode driver keeps no signals at all.
func TestSignalsSparePool(t *testing.T) {
	ctx := context.Background()
	db, err := openAdmin(t)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(4)
	d, err := New(db, &Options{Table: "dlock_test_lease"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, err := d.Subscribe(ctx, randomName("spare"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if b, err := d.Subscribe(ctx, randomName("spare")); err == nil {
		_ = b.Close()
		t.Fatal("a second name watched on a pool of 4")
	}

	db.SetMaxOpenConns(2)
	name := randomName("spare")
	sig := d.leaseSig
	// Refused once, so the next grant counts as contended.
	sig.refused(name)
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sig.mu.Lock()
	n := len(sig.names)
	sig.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d signals kept with a pool of 2", n)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseSignalTakenAfterBusy: a waiter takes and gives back the signal
// in one statement, so the holder's driver can meet it held for an
// instant. Its GET_LOCK then returns 0 and must be sent again: before, the
// driver counted the signal as kept, and waiters polled for as long as the
// lease lasted (sqltest.KindWakes failed in a full run: "the subscription
// to stay quiet for 1.5s while the lock is held").
func TestLeaseSignalTakenAfterBusy(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeLease)
	dn, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer dn.Close()
	d := dn.(*Driver)
	name := randomName("busy")
	sig := hexLit(SignalName(name))
	other, err := h.admin.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var got, otherID int64
	if err := other.QueryRowContext(ctx, "SELECT GET_LOCK("+sig+", 0), CONNECTION_ID()").Scan(&got, &otherID); err != nil || got != 1 {
		t.Fatalf("GET_LOCK on the signal from another session: %d, %v", got, err)
	}
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The fault: the signal stays held by the other session through the
	// holder driver's first attempt to take it (it asks 2ms after the grant).
	testwait.Until(t, 10*time.Second, "the holder's driver to meet the signal held by another session", func() bool {
		return d.leaseSig.busyGets.Load() > 0
	})
	if _, err := other.ExecContext(ctx, "DO RELEASE_LOCK("+sig+")"); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the holder's driver to keep the signal once it is free", func() bool {
		var id sql.NullInt64
		if err := h.admin.QueryRowContext(ctx, "SELECT IS_USED_LOCK("+sig+")").Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id.Valid && id.Int64 != otherID
	})
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "a", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
}
