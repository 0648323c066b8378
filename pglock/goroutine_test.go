package pglock

import (
	"context"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// goroutinesCreated reads the runtime's count of goroutines started so far
// (0 when the runtime does not report it).
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// TestSessionLockStartsNoGoroutine: an uncontended Lock+Unlock through a
// Client in a session mode starts no goroutine. Each hold used to get a
// loss signal of its own, and the Client started a goroutine to watch every
// grant (and woke the previous one to stop it); the holds made one after
// another on a pooled connection now share that connection's signal, whose
// watcher the Client keeps idle for the next grant.
func TestSessionLockStartsNoGoroutine(t *testing.T) {
	if goroutinesCreated() == 0 {
		t.Skip("runtime/metrics has no /sched/goroutines-created")
	}
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			_, c := benchDriver(t, mode)
			m := c.NewMutex(randomName("nogoroutine"), nil)
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
			before := goroutinesCreated()
			for range n {
				cycle()
			}
			// Allow a stray goroutine of the runtime or the test framework.
			if got := goroutinesCreated() - before; got > 5 {
				t.Fatalf("%d Lock+Unlock cycles started %d goroutines, want none", n, got)
			}
		})
	}
}

// TestSessionLossAfterSharedSignal: holds on one pooled connection share
// its loss signal, and a hold that is lost ends it (its connection is
// closed): the next grant gets a new one, open, and a grant that was
// released cleanly before is not reported lost by a later hold's loss.
func TestSessionLossAfterSharedSignal(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeAdvisory)
	dn, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := dn.(*Driver)
	defer d.Close()
	name := randomName("sharedloss")
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
	if g2.Lost != g1.Lost {
		t.Fatal("two holds made one after another on the pool's one idle connection have different loss signals")
	}
	if err := h.Drop(ctx, name); err != nil { // terminates the holder's backend
		t.Fatal(err)
	}
	errs, err := d.Renew(ctx, []driver.Lease{lease(g2)})
	if err != nil || errs[0] == nil {
		t.Fatalf("renewing a hold whose backend was terminated: %v, %v", errs, err)
	}
	select {
	case <-g2.Lost:
	default:
		t.Fatal("the lost hold's Lost is still open")
	}
	g3 := take()
	select {
	case <-g3.Lost:
		t.Fatalf("a new grant after a lost hold came with a closed loss signal (cause %v)", g3.Cause())
	default:
	}
	if _, err := d.Release(ctx, lease(g3)); err != nil {
		t.Fatal(err)
	}
}
