package memlock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// TestStandBack: a driver that releases a mutex its Backend has waiters
// for holds its next new attempt on it back until a woken waiter took the
// lock (the attempt is then refused), while a waiting Lock it refused
// before retries at once; with no waiter left to take it, the new attempt
// waits out the stand-back (2ms) and is granted.
func TestStandBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := memlock.NewBackend()
		d1, d2 := b.NewDriver(), b.NewDriver()
		defer d1.Close()
		defer d2.Close()
		req := func(owner string) driver.AcquireRequest {
			return driver.AcquireRequest{Name: "n", Owner: owner, TTL: time.Minute, Waiting: true}
		}
		release := func(d *memlock.Driver, owner string, g driver.Grant) {
			t.Helper()
			if _, err := d.Release(ctx, driver.Lease{Name: "n", Owner: owner, Token: g.Token, TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		// A waiter in d2, refused and subscribed, retries when woken.
		gh, sub := memlock.HeldWithWaiter(t, d1, d2, req)
		defer sub.Close()
		type result struct {
			g   driver.Grant
			err error
		}
		woken := make(chan result, 1)
		go func() {
			<-sub.C()
			g, err := d2.TryAcquire(ctx, req("waiter"))
			woken <- result{g, err}
		}()
		// A waiter in d1 too, refused before the release.
		if _, err := d1.TryAcquire(ctx, req("own-waiter")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("own waiter: %v, want ErrLocked", err)
		}

		release(d1, "holder", gh)
		start := time.Now()
		if _, err := d1.TryAcquire(ctx, req("next")); !errors.Is(err, driver.ErrLocked) {
			t.Fatalf("a new attempt right after a contended release: %v, want ErrLocked (the woken waiter first)", err)
		}
		w := <-woken
		if w.err != nil {
			t.Fatalf("the woken waiter: %v", w.err)
		}
		if owner, _ := b.Holder("n"); owner != "waiter" {
			t.Fatalf("holder %q, want the woken waiter", owner)
		}
		release(d2, "waiter", w.g)

		// d1's own refused waiter is not held back, though d1 still stands
		// back (its last release found waiters and it was granted nothing
		// since).
		g, err := d1.TryAcquire(ctx, req("own-waiter"))
		if err != nil {
			t.Fatalf("own waiter's retry: %v", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("the attempts took %v of the fake clock, want none (nothing waited out the stand-back)", d)
		}
		// It releases with d2's subscriber still there: d1 stands back
		// again, and a new attempt with nobody to take the lock waits
		// the stand-back out and is granted.
		release(d1, "own-waiter", g)
		start = time.Now()
		g, err = d1.TryAcquire(ctx, req("late"))
		if err != nil {
			t.Fatalf("late: %v", err)
		}
		if d := time.Since(start); d != 2*time.Millisecond {
			t.Fatalf("late waited %v, want the 2ms stand-back", d)
		}
		release(d1, "late", g)
	})
}
