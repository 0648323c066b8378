package redlock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// TestLeftoverReentryGetsAFreshToken: an owner's grant left on one node by
// a failed attempt (its undo never got there) is re-entered by that owner's
// next attempt, which on that node neither increments the fencing counter
// nor reports it, only the leftover's old token. When that node is the one
// the new grant shares with the previous grant's fenced quorum, the token
// must still exceed the previous grant's. Seen as a repeated token on the
// 5-node conformance run under load.
//
// State built on 3 nodes (quorum 2), as a history can leave it: the
// previous grant had token 5, fenced on nodes 0 and 1; node 0 holds a
// leftover of owner O with token 1; node 1 a leftover of another owner
// (token 3); node 2 never saw token 5.
func TestLeftoverReentryGetsAFreshToken(t *testing.T) {
	_, admins, open := safetyEnv(t)
	ctx := ctxT(t, 30*time.Second)
	d, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	k := redisscript.KeysFor(d.(*Driver).prefix, "leftover")
	const ttl = 30 * time.Second
	plant := func(node int, owner string, fenceBefore, fenceAfter string) {
		t.Helper()
		if err := admins[node].Set(ctx, k.Fence, fenceBefore, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := redisscript.Acquire(ctx, admins[node], k, owner, ttl, 0); err != nil {
			t.Fatal(err)
		}
		if err := admins[node].Set(ctx, k.Fence, fenceAfter, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	plant(0, "owner-O", "0", "5")
	plant(1, "owner-Y", "2", "5")
	if err := admins[2].Set(ctx, k.Fence, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "leftover", Owner: "owner-O", TTL: ttl})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if g.Token <= 5 {
		t.Fatalf("granted token %d, but token 5 was granted before: tokens must strictly increase", g.Token)
	}
	if g.Count != 1 {
		t.Fatalf("granted with hold count %d: a dead attempt's leftover counted as a re-entry", g.Count)
	}
	left, err := d.Release(ctx, driver.Lease{Name: "leftover", Owner: "owner-O", Token: g.Token, TTL: ttl, Handle: g.Handle})
	if err != nil || left != 0 {
		t.Fatalf("release: %d, %v; want 0, nil", left, err)
	}
	for _, i := range []int{0, 2} {
		if n, err := admins[i].Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
			t.Fatalf("node %d still holds the lock after the release (%d, %v)", i, n, err)
		}
	}
}

// TestReentryKeepsItsToken: a live lease re-entered by its owner on every
// node keeps its token and counts the hold.
func TestReentryKeepsItsToken(t *testing.T) {
	_, _, open := safetyEnv(t)
	ctx := ctxT(t, 30*time.Second)
	d, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	req := driver.AcquireRequest{Name: "reenter", Owner: "owner-R", TTL: 30 * time.Second}
	g1, err := d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if g2.Token != g1.Token || g2.Count != 2 {
		t.Fatalf("re-entry: token %d count %d, want token %d count 2", g2.Token, g2.Count, g1.Token)
	}
}
