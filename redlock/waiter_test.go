package redlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/redis/go-redis/v9"
)

// TestUndoKeepsWaiterQueued: a queued waiter's attempt that a node grants
// while the others refuse (held there) is undone, and the waiter stays
// queued on that node at its score: the grant took it out of the node's
// queue, and without it the node would order the waiters unlike the
// others (a newcomer could take it). It fails if undo does not requeue.
func TestUndoKeepsWaiterQueued(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 20*time.Second)
	d, err := openTest(ctx, redlockURL(srvs, testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const name = "undo-requeue"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	// A holder on nodes 1 and 2 only.
	for _, a := range admins[1:] {
		if r, err := redisscript.Acquire(ctx, a, k, "holder", 10*time.Second, 0); err != nil || !r.Granted {
			t.Fatalf("holder: %+v, %v", r, err)
		}
	}
	score := time.Now().UnixMilli()
	req := driver.AcquireRequest{Name: name, Owner: "waiter", TTL: 10 * time.Second}
	_, err = d.tryAcquire(ctx, req, score, nil, nil)
	var le *driver.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("tryAcquire = %v, want a LockedError", err)
	}
	q := k.Lock + ":q"
	for i, a := range admins {
		got, err := a.ZScore(ctx, q, "waiter").Result()
		if err != nil || int64(got) != score {
			t.Errorf("node %d: waiter's score %v, %v; want %d", i, got, err, score)
		}
	}
	if n, _ := admins[0].Exists(ctx, k.Lock).Result(); n != 0 {
		t.Errorf("node 0 still holds the undone grant")
	}
}

// TestStaggeredWake: a queued waiter sends its acquire to a node as soon
// as that node's release names it, rather than to every node once a
// quorum of releases has: with the holder's release done on node 0 only,
// the waiter holds node 0 at once (the old code woke it only at the
// quorum-th release and left node 0 free until then); the release on a
// second node completes its grant.
func TestStaggeredWake(t *testing.T) {
	e := newStaggerEnv(t, "node_timeout=2s", "staggered")
	ctx, d, admins, k, name := e.ctx, e.d, e.admins, e.k, e.name
	req := driver.AcquireRequest{Name: name, Owner: "waiter", TTL: 10 * time.Second}
	type res struct {
		g   driver.Grant
		err error
	}
	done := make(chan res, 1)
	go func() {
		g, err := d.Acquire(ctx, req)
		done <- res{g, err}
	}()
	e.waitQueued()
	holds := e.waiterHolds
	e.releaseHolder(0)
	testwait.Until(t, 400*time.Millisecond, "node 0 granted to the waiter its release named", func() bool { return holds(0) })
	select {
	case r := <-done:
		t.Fatalf("Acquire returned with one node free: %+v, %v", r.g, r.err)
	default:
	}
	e.releaseHolder(1)
	var r res
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("no grant after the releases on nodes 0 and 1")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !holds(0) || !holds(1) {
		t.Fatal("the grant does not hold nodes 0 and 1")
	}
	_, _, _ = redisscript.Release(ctx, admins[2], k, "holder", 0)
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: "waiter", TTL: req.TTL, Token: r.g.Token, Handle: r.g.Handle}); err != nil {
		t.Fatal(err)
	}
}

// TestCloseDuringStaggeredAttempt: Close does not wait out the node
// timeout of a waiter that sent its acquire to the one node whose release
// named it and waits for the others: the attempt sends to the rest at once
// (refused there, undone), and Acquire fails with dlock.ErrClosed.
func TestCloseDuringStaggeredAttempt(t *testing.T) {
	e := newStaggerEnv(t, "node_timeout=5s", "staggered-close")
	ctx, d, admins, k, name := e.ctx, e.d, e.admins, e.k, e.name
	done := make(chan error, 1)
	go func() {
		_, err := d.Acquire(ctx, driver.AcquireRequest{Name: name, Owner: "waiter", TTL: 10 * time.Second})
		done <- err
	}()
	e.waitQueued()
	e.releaseHolder(0)
	testwait.Until(t, 2*time.Second, "node 0 granted to the waiter", func() bool { return e.waiterHolds(0) })
	start := time.Now()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Without Close's signal the attempt would wait out its stagger bound
	// (maxStagger from its first send, ≈ maxStagger from here).
	if took := time.Since(start); took > maxStagger/2 {
		t.Errorf("Close took %v, waiting out the staggered attempt's bound (%v)", took, maxStagger)
	}
	if err := <-done; !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("Acquire = %v, want dlock.ErrClosed", err)
	}
	if n, _ := admins[0].Exists(ctx, k.Lock).Result(); n != 0 {
		t.Errorf("node 0 still holds the undone grant after Close")
	}
	for _, a := range admins[1:] {
		_, _, _ = redisscript.Release(ctx, a, k, "holder", 0)
	}
}

// TestStaggerBounded: a staggered attempt whose other nodes' releases do
// not come sends to them after maxStagger even with a long node timeout,
// is refused there and undoes its grant, leaving the waiter queued: it
// does not sit on a node (with its queue entries unrenewed) for the whole
// node timeout.
func TestStaggerBounded(t *testing.T) {
	e := newStaggerEnv(t, "node_timeout=10s", "stagger-bounded")
	ctx, d, admins, k, name := e.ctx, e.d, e.admins, e.k, e.name
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := d.Acquire(actx, driver.AcquireRequest{Name: name, Owner: "waiter", TTL: 10 * time.Second})
		done <- err
	}()
	defer func() {
		cancel()
		<-done
	}()
	e.waitQueued()
	e.releaseHolder(0)
	testwait.Until(t, 2*time.Second, "node 0 granted to the waiter", func() bool { return e.waiterHolds(0) })
	testwait.Until(t, 4*maxStagger, "node 0's grant undone, the waiter queued there again", func() bool {
		n, err := admins[0].Exists(ctx, k.Lock).Result()
		return err == nil && n == 0 && e.queued(0)
	})
}

// TestReleaseNotHeldUpBySlowNode: a grant returned on a quorum while one
// node's acquire is still pending is released at once on the nodes that
// answered; only the slow node's release waits for its acquire's answer
// (so that it does not overtake it). The old code released no node until
// every node had answered.
func TestReleaseNotHeldUpBySlowNode(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 20*time.Second)
	d, err := openTest(ctx, redlockURL(srvs, "node_timeout=3s"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const name = "slow-node-release"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	req := driver.AcquireRequest{Name: name, Owner: "owner", TTL: 10 * time.Second}
	// Warm the connections, so that the pause holds up only the script.
	g, err := d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: req.Owner, TTL: req.TTL, Token: g.Token, Handle: g.Handle}); err != nil {
		t.Fatal(err)
	}
	const pause = 800 * time.Millisecond
	if err := admins[2].ClientPause(ctx, pause).Err(); err != nil {
		t.Fatal(err)
	}
	g, err = d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.Release(ctx, driver.Lease{Name: name, Owner: req.Owner, TTL: req.TTL, Token: g.Token, Handle: g.Handle})
		done <- err
	}()
	testwait.Until(t, pause/2, "nodes 0 and 1 released while node 2 is paused", func() bool {
		n, err := admins[0].Exists(ctx, k.Lock).Result()
		m, err2 := admins[1].Exists(ctx, k.Lock).Result()
		return err == nil && err2 == nil && n == 0 && m == 0
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err := admins[2].Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		t.Errorf("node 2 still holds the lock after Release: %v, %v", n, err)
	}
}

// staggerEnv is the set-up of the staggered wake-up tests: a driver with
// the given URL parameters over three nodes, and the lock name held on
// every node by "holder" (written with the scripts directly), for a
// "waiter" to queue behind.
type staggerEnv struct {
	t      *testing.T
	ctx    context.Context
	d      *Driver
	admins []*redis.Client
	k      redisscript.Keys
	name   string
}

func newStaggerEnv(t *testing.T, params, name string) *staggerEnv {
	t.Helper()
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 20*time.Second)
	d, err := openTest(ctx, redlockURL(srvs, params))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	for i, a := range admins {
		if r, err := redisscript.Acquire(ctx, a, k, "holder", 10*time.Second, 0); err != nil || !r.Granted {
			t.Fatalf("holder on node %d: %+v, %v", i, r, err)
		}
	}
	return &staggerEnv{t: t, ctx: ctx, d: d, admins: admins, k: k, name: name}
}

// queued reports whether "waiter" is in node i's queue.
func (e *staggerEnv) queued(i int) bool {
	_, err := e.admins[i].ZScore(e.ctx, e.k.Lock+":q", "waiter").Result()
	return err == nil
}

// waitQueued waits until "waiter" is queued on every node.
func (e *staggerEnv) waitQueued() {
	e.t.Helper()
	testwait.Until(e.t, 5*time.Second, "the waiter queued on every node", func() bool {
		for i := range e.admins {
			if !e.queued(i) {
				return false
			}
		}
		return true
	})
}

// waiterHolds reports whether "waiter" holds the lock on node i.
func (e *staggerEnv) waiterHolds(i int) bool {
	v, err := e.admins[i].Get(e.ctx, e.k.Lock).Result()
	return err == nil && strings.HasSuffix(v, "\nwaiter")
}

// releaseHolder releases "holder"'s lock on node i, which publishes a
// release naming the first queued waiter there.
func (e *staggerEnv) releaseHolder(i int) {
	e.t.Helper()
	if _, held, err := redisscript.Release(e.ctx, e.admins[i], e.k, "holder", 0); err != nil || !held {
		e.t.Fatalf("release on node %d: %v, %v", i, held, err)
	}
}
