package redlock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

// TestSplitGrantResolvedQuickly: a split grant (node 0's queue has waiter
// a first, nodes 1 and 2 waiter b, so one release grants a on node 0 and
// b on the others) is resolved within a fraction of a long node timeout:
// a, short of a quorum of grants, does not wait the node timeout for the
// rest, which are not coming, but tries again about a round trip after
// its first grant (restWindow), and gives node 0's grant back; b holds the
// lock on its quorum meanwhile.
//
// The bound is half the node timeout (10s), not a wall-clock guess of a
// few round trips: restWindow scales with a's last attempt, which a loaded
// machine slows down. a's driver does not renew its wait within the test
// (renewWait), and the TTLs are longer than the node timeout, so that
// nothing else ends a's wait early: were the window the node timeout, the
// split would last the whole of it. Neither does b's: a renewal puts its
// waiter back at its own score in every queue, which would undo the
// split the test sets up (a first everywhere, or b).
func TestSplitGrantResolvedQuickly(t *testing.T) {
	const nodeTimeout = 10 * time.Second
	testSplitResolved(t, splitCase{name: "grant-split-quick", nodeTimeout: nodeTimeout, ttl: time.Minute, renew: time.Hour, within: nodeTimeout / 2})
}

// TestSplitWakeResolvedQuickly: as TestSplitGrantResolvedQuickly, but node
// 0 has no grant request of a's, so its release wakes a (names it) rather
// than granting it: a's staggered attempt takes node 0 at once and waits
// for nodes 1 and 2 to name it, which granted b instead; it must send
// there (be refused, and give node 0 back) about a round trip later, not
// after maxStagger.
func TestSplitWakeResolvedQuickly(t *testing.T) {
	testSplitResolved(t, splitCase{name: "wake-split-quick", wake: true, nodeTimeout: 3 * time.Second, ttl: 10 * time.Second, renew: time.Hour, within: maxStagger / 2})
}

// splitCase is a split test's set-up: the lock's name, whether node 0's
// release wakes a rather than granting it, the drivers' node timeout, the
// holder's and waiters' TTL, the waiters' drivers' renewWait (zero: the
// default), and the bound on the resolution.
type splitCase struct {
	name        string
	wake        bool
	nodeTimeout time.Duration
	ttl         time.Duration
	renew       time.Duration
	within      time.Duration
}

func testSplitResolved(t *testing.T, c splitCase) {
	name, wake, within, nodeTimeout := c.name, c.wake, c.within, c.nodeTimeout
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 3*nodeTimeout+30*time.Second)
	e := &grantEnv{t: t, ctx: ctx, srvs: srvs, admins: admins, k: redisscript.KeysFor(DefaultKeyPrefix, name), name: name}
	defer e.dumpOnFailure()
	var ds [3]*Driver
	for i := range ds {
		d, err := openTest(ctx, redlockURL(srvs, "node_timeout="+nodeTimeout.String()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		ds[i] = d
	}
	ds[1].renewWait, ds[2].renewWait = c.renew, c.renew
	e.d1 = ds[0]
	e.req = driver.AcquireRequest{Name: name, Owner: "holder", TTL: c.ttl}
	e.holdEverywhere()
	type res struct {
		g   driver.Grant
		err error
	}
	ra, rb := make(chan res, 1), make(chan res, 1)
	reqA := driver.AcquireRequest{Name: name, Owner: "a", TTL: c.ttl}
	reqB := driver.AcquireRequest{Name: name, Owner: "b", TTL: c.ttl}
	go func() {
		g, err := ds[1].Acquire(ctx, reqA)
		ra <- res{g, err}
	}()
	go func() {
		g, err := ds[2].Acquire(ctx, reqB)
		rb <- res{g, err}
	}()
	e.waitRequested("a", nil)
	e.waitRequested("b", nil)
	// A release grants a waiter only if its grant message reaches it (it
	// wakes the waiter otherwise), and a subscription is only sent when
	// the waiter queues: wait until every node has both waiters' drivers
	// on their grant channels and the lock's release channel.
	testwait.Until(t, 10*time.Second, "the waiters' subscriptions on every node", func() bool {
		for _, a := range admins {
			n, err := a.PubSubNumSub(ctx, ds[1].grantCh, ds[2].grantCh, e.k.Channel).Result()
			if err != nil || n[ds[1].grantCh] < 1 || n[ds[2].grantCh] < 1 || n[e.k.Channel] < 2 {
				return false
			}
		}
		return true
	})
	e.splitQueues()
	if wake {
		if err := admins[0].HDel(ctx, grantsKey(e.k), "a").Err(); err != nil {
			t.Fatal(err)
		}
	}
	released := time.Now()
	e.release()
	var b res
	select {
	case b = <-rb:
	case r := <-ra:
		t.Fatalf("a took the lock on node 0's grant alone: %+v, %v", r.g, r.err)
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	if !wake {
		// Node 0 was granted to a by the release (b holds the other two).
		testwait.Until(t, 2*nodeTimeout, "a's grant on node 0 given back", func() bool {
			n, err := admins[0].Exists(ctx, e.k.Lock).Result()
			return err == nil && n == 0
		})
		report(t, "the split grant was resolved", time.Since(released), within)
		select {
		case r := <-ra:
			t.Fatalf("a holds the lock while b does: %+v, %v", r.g, r.err)
		default:
		}
	}
	// With wake, node 0 is a's once its staggered attempt reached it, until
	// that attempt gives it back (refused by nodes 1 and 2): b's release,
	// right away, grants a a quorum only after that.
	if _, err := ds[2].Release(ctx, driver.Lease{Name: name, Owner: reqB.Owner, TTL: reqB.TTL, Token: b.g.Token, Handle: b.g.Handle}); err != nil {
		t.Fatal(err)
	}
	a := <-ra
	if a.err != nil {
		t.Fatal(a.err)
	}
	if wake {
		report(t, "a held the lock", time.Since(released), within)
	}
	if a.g.Token <= b.g.Token {
		t.Errorf("a's token %d is not above b's %d", a.g.Token, b.g.Token)
	}
	if _, err := ds[1].Release(ctx, driver.Lease{Name: name, Owner: reqA.Owner, TTL: reqA.TTL, Token: a.g.Token, Handle: a.g.Handle}); err != nil {
		t.Fatal(err)
	}
}

// report fails t when took is not under within, and logs it otherwise.
func report(t *testing.T, what string, took, within time.Duration) {
	t.Helper()
	if took >= within {
		t.Errorf("%s %v after the release; want under %v", what, took.Round(time.Millisecond), within)
		return
	}
	t.Logf("%s %v after the release", what, took.Round(time.Millisecond))
}
