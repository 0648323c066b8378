package redlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/locktest"
)

// grantEnv is the set-up of the grant-in-release tests: two drivers over
// three nodes, the first ("holder") holding name.
type grantEnv struct {
	t      *testing.T
	ctx    context.Context
	d1, d2 *Driver
	srvs   []*testserver.Server
	admins []*redis.Client
	k      redisscript.Keys
	name   string
	held   driver.Grant
	req    driver.AcquireRequest // the holder's
}

func newGrantEnv(t *testing.T, name string) *grantEnv {
	t.Helper()
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 20*time.Second)
	e := &grantEnv{t: t, ctx: ctx, srvs: srvs, admins: admins, k: redisscript.KeysFor(DefaultKeyPrefix, name), name: name}
	for _, p := range []**Driver{&e.d1, &e.d2} {
		d, err := openTest(ctx, redlockURL(srvs, "node_timeout=1s"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		*p = d
	}
	e.req = driver.AcquireRequest{Name: name, Owner: "holder", TTL: 10 * time.Second}
	e.holdEverywhere()
	return e
}

// holdEverywhere takes the lock for e.req through e.d1 on every node (into
// e.held). The tests' premise is a holder on every node. TryAcquire returns
// on a quorum; under load the last node may answer much later, or not
// grant at all (its call ran out of time, or a waiter's acquire reached it
// first): wait for every node's answer, and take the lock again until
// every node granted it.
func (e *grantEnv) holdEverywhere() {
	t, ctx := e.t, e.ctx
	t.Helper()
	for try := 1; ; try++ {
		g, err := e.d1.TryAcquire(ctx, e.req)
		if err != nil {
			t.Fatal(err)
		}
		h := g.Handle.(*handle)
		testwait.Until(t, 10*time.Second, "every node answered the holder's acquire", func() bool { return h.settled.Load() == nil })
		if held := e.heldOn(); held == len(e.admins) {
			e.held = g
			return
		} else if try == 5 {
			t.Fatalf("the holder's lock reached %d of %d nodes in %d tries; want every node", held, len(e.admins), try)
		}
		if _, err := e.d1.Release(ctx, driver.Lease{Name: e.name, Owner: e.req.Owner, TTL: e.req.TTL, Token: g.Token, Handle: g.Handle}); err != nil {
			t.Fatal(err)
		}
	}
}

// dumpOnFailure logs every node's lock, queue and grant records if the
// test has failed (deferred: a t.Fatal runs it on its way out).
func (e *grantEnv) dumpOnFailure() {
	if !e.t.Failed() {
		return
	}
	for i, a := range e.admins {
		l, _ := a.Get(e.ctx, e.k.Lock).Result()
		q, _ := a.ZRangeWithScores(e.ctx, e.k.Queue, 0, -1).Result()
		g, _ := a.HGetAll(e.ctx, grantsKey(e.k)).Result()
		e.t.Logf("node %d: lock %q, queue %v, qg %q", i, l, q, g)
	}
}

// heldOn counts the nodes whose lock the holder holds.
func (e *grantEnv) heldOn() int {
	n := 0
	for _, a := range e.admins {
		v, err := a.Get(e.ctx, e.k.Lock).Result()
		if _, _, owner, ok := redisscript.ParseValue(v); err == nil && ok && owner == e.req.Owner {
			n++
		}
	}
	return n
}

// requested reports whether owner's grant request is in node i's qg.
func (e *grantEnv) requested(i int, owner string) bool {
	v, err := e.admins[i].HGet(e.ctx, grantsKey(e.k), owner).Result()
	return err == nil && !strings.HasPrefix(v, "=")
}

// waitRequested waits until owner asked every node for grants; done, if
// not nil, fails the test when the waiter's Acquire returns meanwhile.
func (e *grantEnv) waitRequested(owner string, done <-chan error) {
	e.t.Helper()
	defer e.dumpOnFailure()
	testwait.Until(e.t, 10*time.Second, owner+"'s grant request on every node", func() bool {
		select {
		case err := <-done:
			e.t.Fatalf("the waiter's Acquire returned: %v", err)
		default:
		}
		for i := range e.admins {
			if !e.requested(i, owner) {
				return false
			}
		}
		return true
	})
}

// release releases the holder's grant through d1.
func (e *grantEnv) release() {
	e.t.Helper()
	if _, err := e.d1.Release(e.ctx, driver.Lease{Name: e.name, Owner: e.req.Owner, TTL: e.req.TTL, Token: e.held.Token, Handle: e.held.Handle}); err != nil {
		e.t.Fatal(err)
	}
}

// TestGrantInRelease: a waiting Lock asks the nodes for grants, the
// holder's release grants the lock to it on each node and the waiter holds
// the lock on those grant messages, without another acquire: a quorum of
// nodes still has the release's "=token" record for it (an acquire would
// have adopted the grant and removed it). Its lease counts from before the
// release, and its token is above the holder's.
//
// The release is made while none of the waiter's attempts is in flight.
// An attempt of its own can still begin as the release goes out: the
// confirmation of its subscription wakes it to try once more (a release
// between its last attempt and the subscription would be missed
// otherwise), and under load the rest of a quorum of grant messages can
// come after its rest window, when it tries again too. Such an attempt
// rightly counts the lease from its own send time, or adopts the grants;
// the scenario is then run again, up to five times.
func TestGrantInRelease(t *testing.T) {
	for try := 1; ; try++ {
		if grantInReleaseOnce(t, try) {
			return
		}
		if try == 5 {
			t.Fatalf("an attempt of the waiter's own crossed the release in each of %d runs", try)
		}
	}
}

// grantInReleaseOnce runs TestGrantInRelease's scenario once. It returns
// false, having checked what holds whatever the path, when an attempt of
// the waiter's own began after the release was sent or was in flight then.
func grantInReleaseOnce(t *testing.T, try int) bool {
	e := newGrantEnv(t, fmt.Sprintf("grant-in-release-%d", try))
	req := driver.AcquireRequest{Name: e.name, Owner: "waiter", TTL: 10 * time.Second}
	type res struct {
		g   driver.Grant
		err error
	}
	done := make(chan res, 1)
	go func() {
		g, err := e.d2.Acquire(e.ctx, req)
		done <- res{g, err}
	}()
	e.waitRequested("waiter", nil)
	d := e.d2
	testwait.Until(t, 5*time.Second, "no attempt of the waiter's in flight", func() bool { return d.attemptsBegun.Load() == d.attemptsEnded.Load() })
	begun := d.attemptsBegun.Load()
	released := time.Now()
	e.release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Token <= e.held.Token {
		t.Errorf("token %d, not above the holder's %d", r.g.Token, e.held.Token)
	}
	defer func() {
		if _, err := d.Release(e.ctx, driver.Lease{Name: e.name, Owner: req.Owner, TTL: req.TTL, Token: r.g.Token, Handle: r.g.Handle}); err != nil {
			t.Fatal(err)
		}
		for i, a := range e.admins {
			if n, _ := a.Exists(e.ctx, e.k.Lock, grantsKey(e.k)).Result(); n != 0 {
				t.Errorf("node %d: %d keys left after the waiter's release", i, n)
			}
		}
	}()
	if crossed := d.attemptsBegun.Load() - begun; crossed > 0 {
		t.Logf("run %d: %d attempts of the waiter's own crossed the release", try, crossed)
		return false
	}
	if !r.g.Sent.Before(released) {
		t.Errorf("the grant's lease counts from %v, not before the release (%v)", r.g.Sent, released)
	}
	records := 0
	for _, a := range e.admins {
		v, err := a.HGet(e.ctx, grantsKey(e.k), "waiter").Result()
		if err == nil && strings.HasPrefix(v, "=") {
			records++
		}
	}
	if records < d.Quorum() {
		t.Errorf("%d nodes keep a release's grant record for the waiter, want a quorum (%d): the waiter took the lock by an acquire, not on the grants", records, d.Quorum())
	}
	return true
}

// TestDeadWaiterNotGranted: a release does not grant the lock to a queued
// waiter whose driver is gone (its grant message reaches no subscriber):
// the lock is freed on every node and the waiter only woken, as before.
func TestDeadWaiterNotGranted(t *testing.T) {
	e := newGrantEnv(t, "grant-dead-waiter")
	done := make(chan error, 1)
	go func() {
		_, err := e.d2.Acquire(e.ctx, driver.AcquireRequest{Name: e.name, Owner: "waiter", TTL: 10 * time.Second})
		done <- err
	}()
	e.waitRequested("waiter", done)
	e.d2.kill()
	<-done
	testwait.Until(t, 5*time.Second, "the dead driver's grant channel unsubscribed on every node", func() bool {
		for _, a := range e.admins {
			m, err := a.PubSubNumSub(e.ctx, e.d2.grantCh).Result()
			if err != nil || m[e.d2.grantCh] != 0 {
				return false
			}
		}
		return true
	})
	e.release()
	for i, a := range e.admins {
		if v, err := a.Get(e.ctx, e.k.Lock).Result(); err != redis.Nil {
			t.Errorf("node %d: lock %q, %v after the release; want it free (the waiter is dead)", i, v, err)
		}
	}
}

// TestOrphanGrantReleased: a grant made for an owner the driver has no
// waiting Lock for (its Lock returned as the release granted it) is
// released by the driver when its message comes, and the lock is free
// again on every node.
func TestOrphanGrantReleased(t *testing.T) {
	e := newGrantEnv(t, "grant-orphan")
	e.d2.subscribeGrants(e.ctx)
	testwait.Until(t, 5*time.Second, "d2's grant channel subscribed on every node", func() bool {
		for _, a := range e.admins {
			m, err := a.PubSubNumSub(e.ctx, e.d2.grantCh).Result()
			if err != nil || m[e.d2.grantCh] != 1 {
				return false
			}
		}
		return true
	})
	// "ghost" asks every node for grants on d2's channel, as a waiting
	// Lock of d2 would, but d2 has no such Lock.
	for i, a := range e.admins {
		r, _, err := acquireWaiting(e.ctx, a, e.k, "ghost", 10*time.Second, 0, time.Now().UnixMilli(), e.d2.grantCh)
		if err != nil || r.Granted {
			t.Fatalf("node %d: ghost's attempt %+v, %v; want a refusal", i, r, err)
		}
	}
	e.release()
	testwait.Until(t, 5*time.Second, "the ghost's grants released on every node", func() bool {
		for _, a := range e.admins {
			if n, err := a.Exists(e.ctx, e.k.Lock).Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	})
}

// TestOldWaiterWokenNotGranted: a release does not grant to a queue head
// that did not ask for grants (a waiter of an older client, queued by
// redisscript's acquire): it frees the lock and names the waiter, as
// redisscript's release does.
func TestOldWaiterWokenNotGranted(t *testing.T) {
	e := newGrantEnv(t, "grant-old-waiter")
	for i, a := range e.admins {
		r, err := redisscript.AcquireAtScore(e.ctx, a, e.k, "old", 10*time.Second, 0, queueWait, 1)
		if err != nil || r.Granted {
			t.Fatalf("node %d: old waiter's attempt %+v, %v; want a refusal", i, r, err)
		}
	}
	sub := e.admins[0].Subscribe(e.ctx, e.k.Channel)
	defer sub.Close()
	if _, err := sub.Receive(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.release()
	msg, err := sub.ReceiveMessage(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.FormatUint(e.held.Token, 10) + "\nold"; msg.Payload != want {
		t.Errorf("release message %q, want %q", msg.Payload, want)
	}
	for i, a := range e.admins {
		if v, err := a.Get(e.ctx, e.k.Lock).Result(); err != redis.Nil {
			t.Errorf("node %d: lock %q, %v after the release; want it free", i, v, err)
		}
	}
}

// TestGrantCounting: a grant message counts only when its token is above
// the fencing counter that a refused attempt on its node reported (so the
// grant came after that attempt was sent), and no longer once an attempt
// got that token or a later one from the node (the waiter adopted it, and
// may have given it back since).
func TestGrantCounting(t *testing.T) {
	g := newGrantState(3)
	sent := time.Now()
	prev := released{owner: "holder", token: 6}
	g.offer(0, 7, prev)
	if got, msgs := g.counted(); len(got) != 0 || msgs != 1 {
		t.Errorf("before any refusal: %v counted of %d; want none of 1", got, msgs)
	}
	g.refused(0, sent, 7)
	if got, _ := g.counted(); len(got) != 0 {
		t.Errorf("token 7 with the counter at 7 when refused: %v counted; want none (the grant may precede the attempt)", got)
	}
	g.offer(0, 8, prev)
	got, _ := g.counted()
	if len(got) != 1 || got[0] != (nodeGrant{i: 0, token: 8, sent: sent}) {
		t.Errorf("token 8 with the counter at 7: %v counted; want node 0, token 8, from the refusal's send time", got)
	}
	g.granted(0, 8)
	if got, _ := g.counted(); len(got) != 0 {
		t.Errorf("after an attempt got token 8: %v counted; want none", got)
	}
}

// TestGrantsNeedValidity: grants whose lease counts from too long ago
// (more than a third of the TTL) are not taken as the waiter's grant.
func TestGrantsNeedValidity(t *testing.T) {
	_, _, open := safetyEnv(t)
	ctx := ctxT(t, 10*time.Second)
	dd, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := dd.(*Driver)
	defer d.Close()
	req := driver.AcquireRequest{Name: "grant-validity", Owner: "waiter", TTL: 3 * time.Second}
	ops := d.opsFor(req)
	old := time.Now().Add(-req.TTL / 2)
	got := []nodeGrant{{i: 0, token: 5, sent: old}, {i: 1, token: 5, sent: time.Now()}}
	if g, ok, err := d.takeGrants(ctx, &ops, got); ok || err != nil {
		t.Errorf("takeGrants with a lease from TTL/2 ago = %+v, %v, %v; want not taken", g, ok, err)
	}
}

// TestGrantsFromOneRelease: grants count together only when the releases
// that made them freed one grant (same owner and token); grants made by
// the releases of different holders do not make a quorum (one of those
// holders may not have written its token back to that node yet).
func TestGrantsFromOneRelease(t *testing.T) {
	g := newGrantState(3)
	sent := time.Now()
	for i := range 3 {
		g.refused(i, sent, 5)
	}
	a, b := released{owner: "a", token: 5}, released{owner: "b", token: 4}
	g.offer(0, 6, a)
	g.offer(1, 6, b)
	if got, msgs := g.counted(); len(got) != 1 || msgs != 2 {
		t.Errorf("grants from the releases of a and b: %v counted together of %d; want one of 2", got, msgs)
	}
	g.offer(2, 6, a)
	got, _ := g.counted()
	if len(got) != 2 || got[0].i != 0 || got[1].i != 2 {
		t.Errorf("grants of nodes 0 and 2 from a's release: %v counted; want nodes 0 and 2", got)
	}
}

// TestReleaseNotHeldLeavesQueue: a release by an owner that does not hold
// the lock on a node but is queued there (its lease was granted on a
// quorum of other nodes first, so its waiting Lock never left this node's
// queue) takes it out of the queue, so that it does not hold up the next
// waiter there until its entry expires.
func TestReleaseNotHeldLeavesQueue(t *testing.T) {
	e := newGrantEnv(t, "grant-release-leaves")
	a := e.admins[0]
	if r, _, err := acquireWaiting(e.ctx, a, e.k, "w", 10*time.Second, 0, time.Now().UnixMilli(), e.d2.grantCh); err != nil || r.Granted {
		t.Fatalf("w's attempt %+v, %v; want a refusal", r, err)
	}
	if _, held, err := releaseGranting(e.ctx, a, e.k, "w", 0); err != nil || held {
		t.Fatalf("w's release: held %v, %v; want not held", held, err)
	}
	if _, err := a.ZScore(e.ctx, e.k.Queue, "w").Result(); err != redis.Nil {
		t.Errorf("w still queued after its release (%v)", err)
	}
	if _, err := a.HGet(e.ctx, grantsKey(e.k), "w").Result(); err != redis.Nil {
		t.Errorf("w's grant request kept after its release (%v)", err)
	}
}

// TestHotLockHandsOffByGrants: with a hot lock passed among four clients
// (TTL 1s, as the checker's), most hand-offs are grants taken from the
// release's messages, not acquires after a wake-up.
func TestHotLockHandsOffByGrants(t *testing.T) {
	srvs, _, _ := safetyEnv(t)
	ctx := ctxT(t, 30*time.Second)
	var drivers []*Driver
	var lockers []locktest.LockFunc
	for range 4 {
		d, err := openTest(ctx, redlockURL(srvs, testNodeTimeout))
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		drivers = append(drivers, d)
		lockers = append(lockers, locktest.MutexLocker(c.NewMutex("grant-hot", nil)))
	}
	r, err := locktest.HotLock(ctx, locktest.Budget{Duration: time.Second}, lockers)
	if err != nil {
		t.Fatal(err)
	}
	var taken int64
	for _, d := range drivers {
		taken += d.grantsTaken.Load()
	}
	handoffs := r.Ops - r.Retakes - 1
	t.Logf("%d Locks, %d hand-offs, %d taken on grants", r.Ops, handoffs, taken)
	if handoffs < 20 || taken < int64(handoffs)/2 {
		t.Errorf("%d of %d hand-offs taken on grants; want at least half (and 20 hand-offs)", taken, handoffs)
	}
}

// TestSplitGrantsGivenBack: when the nodes' queues disagree (node 0 has
// waiter a first, nodes 1 and 2 waiter b), one release grants a on node 0
// and b on the others: b holds the lock on its quorum, a does not take
// the lock on its one grant but gives it back (its attempt adopts and
// undoes it) and stays queued, and gets the lock once b releases.
func TestSplitGrantsGivenBack(t *testing.T) {
	e := newGrantEnv(t, "grant-split")
	d3, err := openTest(e.ctx, redlockURL(e.srvs, "node_timeout=1s"))
	if err != nil {
		t.Fatal(err)
	}
	defer d3.Close()
	type res struct {
		g   driver.Grant
		err error
	}
	ra, rb := make(chan res, 1), make(chan res, 1)
	reqA := driver.AcquireRequest{Name: e.name, Owner: "a", TTL: 10 * time.Second}
	reqB := driver.AcquireRequest{Name: e.name, Owner: "b", TTL: 10 * time.Second}
	go func() {
		g, err := e.d2.Acquire(e.ctx, reqA)
		ra <- res{g, err}
	}()
	go func() {
		g, err := d3.Acquire(e.ctx, reqB)
		rb <- res{g, err}
	}()
	e.waitRequested("a", nil)
	e.waitRequested("b", nil)
	e.splitQueues()
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
	testwait.Until(t, 5*time.Second, "a's grant on node 0 given back", func() bool {
		n, err := e.admins[0].Exists(e.ctx, e.k.Lock).Result()
		return err == nil && n == 0
	})
	select {
	case r := <-ra:
		t.Fatalf("a holds the lock while b does: %+v, %v", r.g, r.err)
	default:
	}
	if _, err := d3.Release(e.ctx, driver.Lease{Name: e.name, Owner: reqB.Owner, TTL: reqB.TTL, Token: b.g.Token, Handle: b.g.Handle}); err != nil {
		t.Fatal(err)
	}
	a := <-ra
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.g.Token <= b.g.Token {
		t.Errorf("a's token %d is not above b's %d", a.g.Token, b.g.Token)
	}
}

// splitQueues makes the nodes' queues disagree about waiters a and b (both
// queued): node 0 has a first, the other nodes b, so one release grants a
// on node 0 and b on the rest.
func (e *grantEnv) splitQueues() {
	e.t.Helper()
	for i, a := range e.admins {
		first, second := "b", "a"
		if i == 0 {
			first, second = "a", "b"
		}
		n, err := a.ZAddArgs(e.ctx, e.k.Queue, redis.ZAddArgs{XX: true, Ch: true, Members: []redis.Z{{Score: 1, Member: first}, {Score: 2, Member: second}}}).Result()
		if err != nil {
			e.t.Fatal(err)
		}
		if n != 2 {
			// An entry lasts queueWait after its waiter's last attempt.
			e.t.Fatalf("node %d: %d of the waiters' queue entries reordered; want 2 (an entry expired?)", i, n)
		}
	}
}
