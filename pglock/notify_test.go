package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// releaseNotifies takes and releases name on d and reports whether the
// release sent a NOTIFY, as seen by conn, which LISTENs on d's channel:
// after the release the test sends a sentinel NOTIFY of its own, and the
// release notified if its notification comes first.
func releaseNotifies(t *testing.T, d *Driver, conn *pgx.Conn, name string) bool {
	t.Helper()
	return releaseKindNotifies(t, d, conn, name, driver.Exclusive)
}

// releaseKindNotifies is releaseNotifies for a lock of kind k (a read or
// write lock, or a permit of a semaphore of 2), whose release NOTIFYs
// the name with wakeAllPrefix.
func releaseKindNotifies(t *testing.T, d *Driver, conn *pgx.Conn, name string, k driver.Kind) bool {
	t.Helper()
	ctx := context.Background()
	var permits int
	if k == driver.Permit {
		permits = 2
	}
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: 10 * time.Second, Kind: k, Permits: permits})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle, Kind: k, Permits: permits}); err != nil {
		t.Fatal(err)
	}
	payload := name
	if k != driver.Exclusive {
		payload = wakeAllPrefix + name
	}
	if _, err := d.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", d.channel); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Payload == "sentinel" {
		return false
	}
	if n.Payload != payload {
		t.Fatalf("notification %q, want %q or the sentinel", n.Payload, payload)
	}
	if n, err := conn.WaitForNotification(wctx); err != nil || n.Payload != "sentinel" {
		t.Fatalf("after the release's notification: %v, %v; want the sentinel", n, err)
	}
	return true
}

// notifyEnv returns two drivers in mode, d and w, and a connection of the
// test's own that LISTENs on d's channel, all closed when t ends.
func notifyEnv(t *testing.T, mode Mode) (d, w *Driver, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	h := newTestHarness(t, mode)
	d, w = h.openDriver(t), h.openDriver(t)
	conn, err := pgx.Connect(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+quoteIdent(d.channel)); err != nil {
		t.Fatal(err)
	}
	return d, w, conn
}

// TestNotifyOnlyWhenWaited: in every mode a release NOTIFYs only while some
// driver's listener has a subscriber for the name (and for markLinger
// after the last one left). The old code sent a NOTIFY on every release,
// which costs the releasing statement a transaction id and its commit and
// wakes every listening session of the database.
func TestNotifyOnlyWhenWaited(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			d, w, conn := notifyEnv(t, mode)
			name := randomName("notify")
			if releaseNotifies(t, d, conn, name) {
				t.Fatal("a release with nobody waiting sent a NOTIFY")
			}
			// A subscriber on another driver: the release notifies, and
			// the subscriber is woken.
			sub, err := w.Subscribe(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if !releaseNotifies(t, d, conn, name) {
				t.Fatal("a release with a subscriber on another driver sent no NOTIFY")
			}
			select {
			case <-sub.C():
			case <-time.After(5 * time.Second):
				t.Fatal("subscriber not woken")
			}
			// Another name is not marked by that subscriber.
			if releaseNotifies(t, d, conn, name+"-other") {
				t.Fatal("a release of an unwatched name sent a NOTIFY")
			}
			_ = sub.Close()
			// The mark lingers, then goes.
			testwait.Until(t, markLinger+10*time.Second, "releases to stop notifying once the subscriber left", func() bool {
				return !releaseNotifies(t, d, conn, name)
			})
		})
	}
}

// TestKindNotifyOnlyWhenWaited: as TestNotifyOnlyWhenWaited for the
// releases of read and write locks and of semaphore permits, which used to
// NOTIFY always.
func TestKindNotifyOnlyWhenWaited(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			d, w, conn := notifyEnv(t, mode)
			kinds := []driver.Kind{driver.Read, driver.Write}
			if mode == ModeLease {
				kinds = append(kinds, driver.Permit)
			}
			for _, k := range kinds {
				name := randomName("notify-" + k.String())
				if releaseKindNotifies(t, d, conn, name, k) {
					t.Fatalf("a %s release with nobody waiting sent a NOTIFY", k)
				}
				sub, err := w.Subscribe(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if !releaseKindNotifies(t, d, conn, name, k) {
					t.Fatalf("a %s release with a subscriber on another driver sent no NOTIFY", k)
				}
				select {
				case <-sub.C():
				case <-time.After(5 * time.Second):
					t.Fatal("subscriber not woken")
				}
				_ = sub.Close()
			}
		})
	}
}

// TestSubscribeMarksBeforeReturning: a release right after Subscribe
// returns is delivered, however the releases and subscriptions interleave:
// many rounds of subscribe, release on another driver, wait.
func TestSubscribeMarksBeforeReturning(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeAdvisory)
	d, w := h.openDriver(t), h.openDriver(t)
	for i := range 50 {
		name := randomName("mark")
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan error, 1)
		go func() {
			_, err := d.Release(ctx, driver.Lease{Name: name, Owner: "o", Token: g.Token, TTL: 10 * time.Second, Handle: g.Handle})
			released <- err
		}()
		sub, err := w.Subscribe(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		// Either the lock is free now, or the release that frees it
		// notifies this subscriber.
		wg, err := w.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "w", TTL: 10 * time.Second})
		switch {
		case err == nil:
			if _, err := w.Release(ctx, driver.Lease{Name: name, Owner: "w", Token: wg.Token, TTL: 10 * time.Second, Handle: wg.Handle}); err != nil {
				t.Fatal(err)
			}
		case errors.Is(err, driver.ErrLocked):
			select {
			case <-sub.C():
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: refused after Subscribe, and the release was not delivered", i)
			}
		default:
			t.Fatal(err)
		}
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		_ = sub.Close()
	}
}
