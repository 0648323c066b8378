package memlock

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock/dlock/driver"
)

func woken(s driver.Subscription) bool {
	select {
	case <-s.C():
		return true
	default:
		return false
	}
}

// oneDriver returns a new Backend, a Driver on it closed with the test,
// and the requests of owners for the mutex "n" (Waiting as given).
func oneDriver(t *testing.T, waiting bool) (*Backend, *Driver, func(owner string) driver.AcquireRequest) {
	b := NewBackend()
	d := b.NewDriver()
	t.Cleanup(func() { _ = d.Close() })
	return b, d, func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: "n", Owner: owner, TTL: time.Minute, Waiting: waiting}
	}
}

// TestReleaseWakesLongestWaiterFirst: a mutex release wakes the subscriber
// that subscribed first; the others are woken wakeRestAfter later only if
// nobody was granted the lock meanwhile.
func TestReleaseWakesLongestWaiterFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b, d, req := oneDriver(t, false)
		var subs [3]driver.Subscription
		for i := range subs {
			s, err := b.NewDriver().Subscribe(ctx, "n")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			subs[i] = s
		}
		release := func(owner string, g driver.Grant) {
			t.Helper()
			if _, err := d.Release(ctx, driver.Lease{Name: "n", Owner: owner, Token: g.Token}); err != nil {
				t.Fatal(err)
			}
		}
		g, err := d.TryAcquire(ctx, req("a"))
		if err != nil {
			t.Fatal(err)
		}
		release("a", g)
		if !woken(subs[0]) || woken(subs[1]) || woken(subs[2]) {
			t.Fatal("a release woke other subscribers than the first")
		}
		// Nobody takes the lock: the others are woken too.
		time.Sleep(wakeRestAfter)
		synctest.Wait()
		if !woken(subs[1]) || !woken(subs[2]) {
			t.Fatal("the other subscribers were not woken with the lock left free")
		}

		// The first subscriber leaves; the lock is granted within
		// wakeRestAfter of the next release: only the new first is woken.
		_ = subs[0].Close()
		g, err = d.TryAcquire(ctx, req("b"))
		if err != nil {
			t.Fatal(err)
		}
		release("b", g)
		if _, err := d.TryAcquire(ctx, req("c")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * wakeRestAfter)
		synctest.Wait()
		if !woken(subs[1]) || woken(subs[2]) {
			t.Fatal("want only the longest-waiting subscriber woken when the lock was granted meanwhile")
		}
	})
}

// TestStandingBackCountsAsWaiting: an attempt standing back for the next
// grant is a waiter: a release while it stands back makes the releaser
// stand back too (in a hot loop such attempts were never subscribed, and
// the releaser re-took the lock 77% of the time), and once it has been
// made it no longer counts.
func TestStandingBackCountsAsWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b, d, req := oneDriver(t, true)
		cycle := func(owner string) time.Duration {
			t.Helper()
			start := time.Now()
			g, err := d.TryAcquire(ctx, req(owner))
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if _, err := d.Release(ctx, driver.Lease{Name: "n", Owner: owner, Token: g.Token}); err != nil {
				t.Fatal(err)
			}
			return took
		}
		cycle("a")
		b.mu.Lock()
		last := b.locks["n"].fence
		b.mu.Unlock()
		if took := cycle("b"); took != 0 {
			t.Fatalf("no waiter: the next Lock stood back %v", took)
		}
		b.nextGrant("n", last+1) // an attempt of another driver starts standing back, after b's release
		cycle("c")               // its grant ends that stand-back, but the attempt is not made yet
		if took := cycle("d"); took != 2*time.Millisecond {
			t.Fatalf("after a release with an attempt standing back, the next Lock waited %v, want the 2ms stand-back", took)
		}
		b.stoodBack("n") // the attempt was made
		cycle("e")
		if took := cycle("f"); took != 0 {
			t.Fatalf("with no waiter left, the next Lock stood back %v", took)
		}
	})
}

// HeldWithWaiter has d1 take the mutex of req("holder") and d2 subscribe
// to it and be refused it for req("waiter"); it returns the holder's grant
// and d2's subscription, which the caller closes. (Exported for the tests
// of package memlock_test.)
func HeldWithWaiter(t *testing.T, d1, d2 *Driver, req func(owner string) driver.AcquireRequest) (driver.Grant, driver.Subscription) {
	t.Helper()
	ctx := context.Background()
	gh, err := d1.TryAcquire(ctx, req("holder"))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := d2.Subscribe(ctx, req("waiter").Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d2.TryAcquire(ctx, req("waiter")); !errors.Is(err, driver.ErrLocked) {
		sub.Close()
		t.Fatalf("waiter: %v, want ErrLocked", err)
	}
	return gh, sub
}

// TestStandBackAfterWaiterGranted: the waiter a release woke may be granted
// between an attempt's look at its driver's stand-back and the attempt's
// wait for the next grant; the attempt is then made at once. (It waited out
// the whole 2ms stand-back before, for a grant that had already happened:
// TestStandBack failed so, now and then, under load.)
func TestStandBackAfterWaiterGranted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b, d1, req := oneDriver(t, true)
		d2 := b.NewDriver()
		defer d2.Close()
		gh, sub := HeldWithWaiter(t, d1, d2, req)
		defer sub.Close()
		if _, err := d1.Release(ctx, driver.Lease{Name: "n", Owner: "holder", Token: gh.Token}); err != nil {
			t.Fatal(err)
		}
		stood := false
		d1.stand.TestHook = func() {
			stood = true
			if _, err := d2.TryAcquire(ctx, req("waiter")); err != nil {
				t.Errorf("the woken waiter: %v", err)
			}
		}
		start := time.Now()
		if _, err := d1.TryAcquire(ctx, req("next")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("next: %v, want ErrLocked (the woken waiter holds the lock)", err)
		}
		if !stood {
			t.Fatal("the attempt did not stand back: the test did not set up what it means to")
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("the attempt waited %v for a grant that had happened, want 0", d)
		}
	})
}
