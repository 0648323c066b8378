package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestInspectCountsServerWaiters: in ModeAdvisory, Inspect counts the Locks
// waiting for a mutex in the server (blocked in pg_advisory_lock), and
// stops counting one when its wait ends. It used to report -1 (unknown).
func TestInspectCountsServerWaiters(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeAdvisory)
	holder, waiter := h.driver(t).(*Driver), h.driver(t).(*Driver)
	name := randomName("inspect-waiters")
	g, err := holder.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "h", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx, driver.Lease{Name: name, Owner: "h", Token: g.Token, Handle: g.Handle, TTL: time.Minute})
	waiters := func() int {
		infos, err := holder.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, li := range infos {
			if li.Name == name && li.Kind == driver.Exclusive {
				return li.Waiters
			}
		}
		t.Fatalf("Inspect did not list %q: %+v", name, infos)
		return 0
	}
	if n := waiters(); n != 0 {
		t.Fatalf("Waiters = %d with nobody waiting, want 0", n)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, driver.AcquireRequest{Name: name, Owner: "w", TTL: time.Minute})
		done <- err
	}()
	testwait.Until(t, 10*time.Second, "Inspect to count the waiter blocked in the server", func() bool { return waiters() == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the waiter was granted a held lock")
	}
	testwait.Until(t, 10*time.Second, "Inspect to stop counting the cancelled waiter", func() bool { return waiters() == 0 })
}
