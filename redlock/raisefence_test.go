package redlock

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// TestRaiseFenceHeldNodes: RaiseFence, as the quorum lock calls it (while
// the caller holds the lock there), must not succeed while a node the
// caller holds was not raised. A quorum of raised nodes is not enough when
// one of them is held by another owner: that owner was granted there
// before the raise, with a smaller token, and completes its majority on the
// unraised node once the caller releases it.
//
// On 3 nodes (quorum 2): owner A holds nodes 0 and 1 (token 5), owner C
// was granted node 2 before the raise (token 3). Node 1's writes are paused
// beyond the node timeout, so the raise to 100 lands on nodes 0 and 2 only.
// If RaiseFence reported success, A (whose grant the quorum lock returns
// with token 100) releases, C is granted node 1 with token 6 and holds the
// lock on {1, 2} with token max(3, 6) = 6, after A's 100. RaiseFence must
// fail instead (here, it must raise every node).
func TestRaiseFenceHeldNodes(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 30*time.Second)
	d, err := openTest(ctx, redlockURL(srvs, "node_timeout=300ms"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const name, ttl, raiseTo = "raise-held", 30 * time.Second, 100
	k := redisscript.KeysFor(d.prefix, name)
	acquire := func(i int, owner string, counter, want uint64) {
		t.Helper()
		if err := admins[i].Set(ctx, k.Fence, strconv.FormatUint(counter, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		if a, err := redisscript.Acquire(ctx, admins[i], k, owner, ttl, 0); err != nil || !a.Granted || a.Fence != want {
			t.Fatalf("%s on node %d: %+v, %v; want granted with token %d", owner, i, a, err, want)
		}
	}
	acquire(0, "owner-A", 4, 5)
	acquire(1, "owner-A", 4, 5)
	acquire(2, "owner-C", 2, 3)

	for _, a := range admins {
		t.Cleanup(func() { _ = a.Do(context.Background(), "client", "unpause").Err() })
	}
	pauseWrites(ctx, t, admins[1], 20*time.Second) // until unpaused below
	raiseErr := d.RaiseFence(ctx, name, driver.Exclusive, raiseTo)
	c1, err := admins[1].Get(ctx, k.Fence).Uint64() // reads go on
	if err != nil {
		t.Fatal(err)
	}
	if err := admins[1].Do(ctx, "client", "unpause").Err(); err != nil {
		t.Fatal(err)
	}
	if raiseErr == nil && c1 < raiseTo {
		t.Errorf("RaiseFence(%d) succeeded while node 1, held by the raiser, had fencing counter %d: "+
			"the raised quorum counted node 2, held by owner C since before the raise (token 3)", raiseTo, c1)
	}
	if raiseErr == nil {
		// The rest of the story: A releases, C is granted node 1.
		for i := range 2 {
			if _, _, err := redisscript.Release(ctx, admins[i], k, "owner-A", 5); err != nil {
				t.Fatal(err)
			}
		}
		a, err := redisscript.Acquire(ctx, admins[1], k, "owner-C", ttl, 0)
		if err != nil || !a.Granted {
			t.Fatalf("owner C on node 1 after A's release: %+v, %v; want granted", a, err)
		}
		if tok := max(a.Fence, 3); tok <= raiseTo {
			t.Fatalf("owner C holds a majority {1, 2} with token %d after a raise to %d", tok, raiseTo)
		}
	}
}
