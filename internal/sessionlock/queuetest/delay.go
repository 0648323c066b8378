package queuetest

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// Delay describes a backend's lock-delay for LockDelay.
type Delay struct {
	// Delay is the lock-delay the test asks for.
	Delay time.Duration
	// Lose ends a holder's grant g, made through d, without a release, and
	// returns once its entry is gone from the server; the lock-delay runs
	// from about then, up to Slack earlier.
	Lose  func(t testing.TB, d Driver, g driver.Grant)
	Slack time.Duration
	// Guard, when not nil, reports whether the lock-delay guard of name
	// exists.
	Guard func(t testing.TB, name string) bool
	// RetryAfter is set when a TryAcquire refused by a lock-delay reports
	// the time left in LockedError.RetryAfter.
	RetryAfter bool
	// StaleRelease is set when a release of the lost grant must report
	// ErrNotHeld (its driver still runs).
	StaleRelease bool
}

// LockDelay: a clean release of a grant with a lock-delay frees the lock at
// once, guard and all; a holder that ends without a release keeps the lock
// unavailable for the delay, to TryAcquire and to a waiter.
func LockDelay(t *testing.T, be Backend, ld Delay) {
	b := be.NewDriver(t)
	ctx := Ctx(t, 30*time.Second)
	withDelay := func(name, owner string) driver.AcquireRequest {
		r := Req(name, owner)
		r.LockDelay = ld.Delay
		return r
	}
	guard := func(name string, want bool, what string) {
		t.Helper()
		if ld.Guard != nil && ld.Guard(t, name) != want {
			t.Fatal(what)
		}
	}

	a := be.NewDriver(t)
	g, err := a.TryAcquire(ctx, withDelay("ld1", "A"))
	if err != nil {
		t.Fatal(err)
	}
	guard("ld1", true, "no guard for a lock-delay grant")
	if _, err := a.Release(ctx, Lease("ld1", "A", g)); err != nil {
		t.Fatal(err)
	}
	guard("ld1", false, "guard left after a release")
	gb, err := b.TryAcquire(ctx, Req("ld1", "B"))
	if err != nil {
		t.Fatalf("TryAcquire right after a clean release of a lock-delay grant: %v", err)
	}
	b.Release(ctx, Lease("ld1", "B", gb))

	ga, err := a.TryAcquire(ctx, withDelay("ld2", "A"))
	if err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	ld.Lose(t, a, ga)
	gone := time.Now()
	_, err = b.TryAcquire(ctx, Req("ld2", "B"))
	var le *driver.LockedError
	if !errors.As(err, &le) || !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire inside the lock-delay: %v, want LockedError", err)
	}
	if ld.RetryAfter && (le.RetryAfter <= 0 || le.RetryAfter > ld.Delay) {
		t.Fatalf("TryAcquire inside the lock-delay: RetryAfter %v, want it in (0, %v]", le.RetryAfter, ld.Delay)
	}
	c := be.NewDriver(t)
	gc, err := c.Acquire(ctx, Req("ld2", "C"))
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(gone)
	t.Logf("granted %v after the holder was lost, %v after its entry went", time.Since(lost).Round(time.Millisecond), waited.Round(time.Millisecond))
	if waited < ld.Delay-ld.Slack {
		t.Fatalf("granted %v after the holder's entry went; lock-delay %v not honoured", waited, ld.Delay)
	}
	if gc.Token <= ga.Token {
		t.Fatalf("token %d <= lost holder's %d", gc.Token, ga.Token)
	}
	if ld.StaleRelease {
		if _, err := a.Release(ctx, Lease("ld2", "A", ga)); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release of the lost grant: %v, want ErrNotHeld", err)
		}
	}
	c.Release(ctx, Lease("ld2", "C", gc))
	guard("ld2", false, "guard left after the delay")
}
