package sqltest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// NoGoroutinePerLock checks that uncontended Lock+Unlock cycles of m, each
// with a context of its own (as a caller with a timeout per call has),
// start no goroutine once warmed up.
func NoGoroutinePerLock(t *testing.T, m *dlock.Mutex) {
	t.Helper()
	if testwait.GoroutinesCreated() == 0 {
		t.Skip("runtime/metrics has no /sched/goroutines-created")
	}
	cycle := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // the connections are made, the Client's goroutines woken once
	cycle()
	const n = 50
	before := testwait.GoroutinesCreated()
	for range n {
		cycle()
	}
	// Allow a stray goroutine of the runtime or the test framework.
	if got := testwait.GoroutinesCreated() - before; got > 5 {
		t.Fatalf("%d Lock+Unlock cycles started %d goroutines, want none", n, got)
	}
}

// SharedLossSignal checks the loss signals of a session-mode driver d whose
// holds made one after another on a pooled connection share its signal:
// two holds taken and released in turn (on the pool's one idle connection)
// have the same Grant.Lost; a hold that is lost (drop ends its session from
// outside, found by Renew) closes it; and the next grant, on a new
// connection, comes with a signal that is open.
func SharedLossSignal(t *testing.T, d driver.Driver, drop func(ctx context.Context, name string) error) {
	t.Helper()
	ctx := context.Background()
	name := RandomName("sharedloss")
	req := driver.AcquireRequest{Name: name, Owner: "o", TTL: 30 * time.Second}
	take := func() driver.Grant {
		t.Helper()
		g, err := d.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	lease := func(g driver.Grant) driver.Lease {
		return driver.Lease{Name: name, Owner: "o", Token: g.Token, Handle: g.Handle, TTL: req.TTL}
	}
	g1 := take()
	if _, err := d.Release(ctx, lease(g1)); err != nil {
		t.Fatal(err)
	}
	g2 := take()
	if g2.Lost == nil || g2.Lost != g1.Lost {
		t.Fatal("two holds made one after another on the pool's one idle connection have different loss signals")
	}
	if err := drop(ctx, name); err != nil {
		t.Fatal(err)
	}
	errs, err := d.Renew(ctx, []driver.Lease{lease(g2)})
	if err != nil || errs[0] == nil {
		t.Fatalf("renewing a hold whose session was ended: %v, %v", errs, err)
	}
	select {
	case <-g2.Lost:
	default:
		t.Fatal("the lost hold's Lost is still open")
	}
	// A terminated session's locks go when its server process has exited,
	// which may be after the terminating call returned: wait for the name
	// to be free rather than take it once.
	var g3 driver.Grant
	testwait.Until(t, 10*time.Second, "the dropped hold's lock to be free", func() bool {
		g, err := d.TryAcquire(ctx, req)
		if errors.Is(err, dlock.ErrLocked) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		g3 = g
		return true
	})
	select {
	case <-g3.Lost:
		t.Fatalf("a new grant after a lost hold came with a closed loss signal (cause %v)", g3.Cause())
	default:
	}
	if _, err := d.Release(ctx, lease(g3)); err != nil {
		t.Fatal(err)
	}
}
