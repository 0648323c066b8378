package etcdlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

// TestLeaderKilledWhileHeld kills the leader of a 3-member cluster while a
// lock is held and another client waits for it. The holder must keep the
// lock or be told it lost it; the waiter must never get the lock while the
// holder still believes it holds it.
func TestLeaderKilledWhileHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster: skipped in -short mode")
	}
	c := testserver.Etcd(t, 3)
	// The lease must outlast an election (1s election timeout), as in any
	// deployment: a lease shorter than the time to elect a leader is lost
	// (cleanly: Done closes) whenever the leader dies.
	const ttl = 5 * time.Second
	a := newTestDriver(t, newClient(t, c.Endpoints()), &Options{SessionTTL: ttl})
	b := newTestDriver(t, newClient(t, c.Endpoints()), &Options{SessionTTL: ttl})
	ctx := ctxT(t, 60*time.Second)
	ga, err := a.TryAcquire(ctx, req("failover", "A"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, req("failover", "B"))
		got <- result{g, err, time.Now()}
	}()
	eventually(t, 5*time.Second, "B queued", func() bool { return len(keys(t, a.cli, "failover/")) == 2 })

	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader m%d", leader)

	// For three TTLs, A either keeps proving its lock or learns it is lost;
	// B must not get the lock while A holds it.
	aLost := false
	var confirmed int
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) && !aLost {
		select {
		case r := <-got:
			t.Fatalf("B got the lock (%v) while A had not lost it", r.err)
		case <-ga.Lost:
			aLost = true
			continue
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		errs, err := a.Renew(rctx, []driver.Lease{lease("failover", "A", ga)})
		cancel()
		switch {
		case err == nil && errs[0] == nil:
			confirmed++
		case err == nil && errors.Is(errs[0], driver.ErrNotHeld):
			aLost = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("A confirmed its lock %d times after the kill; lost: %v", confirmed, aLost)
	if !aLost {
		if confirmed == 0 {
			t.Fatal("A neither kept nor lost its lock within three TTLs")
		}
		if _, err := a.Release(ctx, lease("failover", "A", ga)); err != nil {
			t.Fatalf("Release after failover: %v", err)
		}
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("B: %v", r.err)
		}
		if r.g.Token <= ga.Token {
			t.Fatalf("B's token %d <= A's %d", r.g.Token, ga.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("B did not get the lock after A let go")
	}
}
