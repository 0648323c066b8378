package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

// TestLeaderKilledWhileHeld kills the leader of a 3-node ensemble while a
// lock is held and another client waits for it. The holder must keep the
// lock or be told it lost it; the waiter must never get the lock while the
// holder still believes it holds it.
func TestLeaderKilledWhileHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node ensemble: skipped in -short mode")
	}
	c := testserver.ZooKeeper(t, 3)
	const session = 4 * time.Second
	connA, err := connect(c.Endpoints(), session)
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close()
	connB, err := connect(c.Endpoints(), session)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close()
	a := newTestDriver(t, connA, &Options{SessionTimeout: session})
	b := newTestDriver(t, connB, &Options{SessionTimeout: session})
	ctx := ctxT(t, 60*time.Second)
	ga, err := a.TryAcquire(ctx, req("failover", "A"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, req("failover", "B"))
		got <- result{g, err}
	}()
	eventually(t, 5*time.Second, "B queued", func() bool { return len(children(t, connA, "/dlock/failover")) == 2 })

	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader %d", leader)

	aLost := false
	confirmed := 0
	deadline := time.Now().Add(3 * session)
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
			t.Fatal("A neither kept nor lost its lock within three session timeouts")
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
