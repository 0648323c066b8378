package quorum_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TestNestedRaiseFenceHeldNodes: the quorum driver's own RaiseFence (a
// quorum lock as a node of another) must not succeed while a node the
// caller holds was not raised. On 3 mem nodes: owner A holds nodes 0 and 1,
// owner C was granted node 2 before the raise (token 3), and node 1's raise
// fails. A majority {0, 2} raised is not enough: after A releases, C is
// granted node 1 and holds {1, 2} with a token below the raise.
func TestNestedRaiseFenceHeldNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, ds := memNodes(t, 3)
	const name, raiseTo = "raise-nested", 100
	ttl := 10 * time.Second
	hold := func(i int, owner string, counter, want uint64) driver.Grant {
		t.Helper()
		if err := ds[i].RaiseFence(ctx, name, driver.Exclusive, counter); err != nil {
			t.Fatal(err)
		}
		g, err := ds[i].TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: ttl})
		if err != nil || g.Token != want {
			t.Fatalf("%s on node %d: %+v, %v; want token %d", owner, i, g, err, want)
		}
		return g
	}
	a0 := hold(0, "owner-A", 4, 5)
	a1 := hold(1, "owner-A", 4, 5)
	hold(2, "owner-C", 2, 3)

	q := newMemQuorum(t, ds)
	defer q.Close()
	ds[1].FailCalls(func(op string) error {
		if op == "raise" {
			return errors.New("raise lost (test)")
		}
		return nil
	})
	raiseErr := q.RaiseFence(ctx, name, driver.Exclusive, raiseTo)
	ds[1].FailCalls(nil)
	if raiseErr == nil {
		t.Errorf("RaiseFence(%d) succeeded although node 1, held by the raiser, was not raised: "+
			"the raised majority counted node 2, held by owner C since before the raise (token 3)", raiseTo)
		// The rest of the story: A releases, C is granted node 1.
		for i, g := range []driver.Grant{a0, a1} {
			if _, err := ds[i].Release(ctx, driver.Lease{Name: name, Owner: "owner-A", Token: g.Token, Handle: g.Handle, TTL: ttl}); err != nil {
				t.Fatal(err)
			}
		}
		g, err := ds[1].TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-C", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if tok := max(g.Token, 3); tok <= raiseTo {
			t.Fatalf("owner C holds a majority {1, 2} with token %d after a raise to %d", tok, raiseTo)
		}
	}
}
