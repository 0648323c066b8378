package queuetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

// Failover is a lock held through A, waited for through B, while the
// leader of Cluster is killed.
type Failover struct {
	A, B    Driver
	Cluster *testserver.Cluster
	// Queue lists the queue entries of the lock name.
	Queue func(name string) []string
	// TTL is the drivers' session TTL, and the TTL the requests ask for.
	TTL time.Duration
}

// LeaderKilledWhileHeld kills the leader while f.A holds a lock and f.B waits
// for it. A must keep the lock or be told it lost it; B must never get the
// lock while A still believes it holds it.
func LeaderKilledWhileHeld(t *testing.T, f Failover) {
	a, b := f.A, f.B
	ctx := Ctx(t, 60*time.Second)
	// The requests ask for the TTL the lock must have to outlast an
	// election: drivers whose grants take the request's TTL (etcd) use it.
	req := func(owner string) driver.AcquireRequest {
		r := Req("failover", owner)
		r.TTL = f.TTL
		return r
	}
	ga, err := a.TryAcquire(ctx, req("A"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := b.Acquire(ctx, req("B"))
		got <- result{g, err}
	}()
	Eventually(t, 5*time.Second, "B queued", func() bool { return len(f.Queue("failover")) == 2 })
	leader, err := f.Cluster.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Cluster.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed leader %d", leader)

	// For three TTLs, A either keeps proving its lock or learns it is lost;
	// B must not get the lock while A holds it.
	aLost := false
	confirmed := 0
	deadline := time.Now().Add(3 * f.TTL)
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
		errs, err := a.Renew(rctx, []driver.Lease{Lease("failover", "A", ga)})
		cancel()
		switch {
		case err == nil && errs[0] == nil:
			confirmed++
		case err == nil && errors.Is(errs[0], driver.ErrNotHeld):
			aLost = true
		}
		time.Sleep(100 * time.Millisecond) // the pace of renewals, not a wait for a condition
	}
	t.Logf("A confirmed its lock %d times after the kill; lost: %v", confirmed, aLost)
	if !aLost {
		if confirmed == 0 {
			t.Fatal("A neither kept nor lost its lock within three TTLs")
		}
		if _, err := a.Release(ctx, Lease("failover", "A", ga)); err != nil {
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
