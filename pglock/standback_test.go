package pglock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TestStandBack: in lease mode, a release whose statement NOTIFYs waiters
// makes its driver hold its next new attempt on the name back for a
// moment, while a waiting Lock it refused before (its retry answers the
// wake-up) goes at once; a release nobody waited for starts no
// stand-back.
func TestStandBack(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeLease)
	d, other := h.driver(t).(*Driver), h.driver(t).(*Driver)
	var standing atomic.Int64
	d.stand.TestHook = func() { standing.Add(1) }
	name := randomName("standback")
	req := func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: name, Owner: owner, TTL: time.Minute, Waiting: true}
	}
	take := func(owner string) driver.Grant {
		t.Helper()
		g, err := d.TryAcquire(ctx, req(owner))
		if err != nil {
			t.Fatalf("%s: %v", owner, err)
		}
		return g
	}
	release := func(owner string, g driver.Grant) {
		t.Helper()
		if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: owner, Token: g.Token, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(want int64, what string) {
		t.Helper()
		if n := standing.Load(); n != want {
			t.Fatalf("%s: %d stand-backs so far, want %d", what, n, want)
		}
	}

	// Nobody waits: no stand-back.
	release("a", take("a"))
	release("b", take("b"))
	check(0, "releases nobody waited for")

	// Another driver waits (its listener marks the name).
	sub, err := other.Subscribe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	g := take("holder")
	if _, err := d.TryAcquire(ctx, req("waiter")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("waiter: %v, want ErrLocked", err)
	}
	release("holder", g)
	g = take("waiter")
	check(0, "a refused waiter's retry after a release that woke waiters")
	release("waiter", g)
	release("next", take("next"))
	check(1, "a new attempt after a release that woke waiters")
}
