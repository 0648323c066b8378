package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// serverMinTTL is the test servers' minimum lease TTL: 1.5 election timeouts
// of 1s, rounded up to whole seconds.
const serverMinTTL = 2 * time.Second

// onlySession is d's one live lease; it fails t when d has not exactly one.
func onlySession(t testing.TB, d *Driver) *session {
	t.Helper()
	ss := d.liveSessions()
	if len(ss) != 1 {
		t.Fatalf("driver has %d leases, want 1", len(ss))
	}
	return ss[0]
}

func reqTTL(name, owner string, ttl time.Duration) driver.AcquireRequest {
	r := queuetest.Req(name, owner)
	r.TTL = ttl
	return r
}

// keyLease is the etcd lease the key of g is bound to, and that lease's TTL
// as the server granted it.
func keyLease(t testing.TB, cli *clientv3.Client, g driver.Grant) (clientv3.LeaseID, time.Duration) {
	t.Helper()
	ctx := queuetest.Ctx(t, 5*time.Second)
	resp, err := cli.Get(ctx, g.Handle.(*handle).key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("key of grant %d is gone", g.Token)
	}
	id := clientv3.LeaseID(resp.Kvs[0].Lease)
	ttl, err := cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return id, time.Duration(ttl.GrantedTTL) * time.Second
}

// TestKilledHolderFreesLockAfterItsTTL: the audit's finding 4. A lock taken
// with TTL 2s, whose holder disappears without releasing, is free about 2s
// later, not after a driver-wide session TTL (it was 10s by default).
func TestKilledHolderFreesLockAfterItsTTL(t *testing.T) {
	const ttl = 2 * time.Second
	cliA := newClient(t, shared.Endpoints())
	a := queuetest.Open(t, func() (*Driver, error) { return New(cliA, nil) })
	b := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	ga, err := a.TryAcquire(ctx, reqTTL("ttl-kill", "A", ttl))
	if err != nil {
		t.Fatal(err)
	}
	// A crashes: no release, no revoke, no keepalive.
	a.stop()
	cliA.Close()
	killed := time.Now()
	// Closing a driver whose client is closed does not spin on revokes.
	if err := a.Close(); err == nil || time.Since(killed) > time.Second {
		t.Fatalf("Close after the client was closed: %v after %v; want an error at once", err, time.Since(killed))
	}
	// The server expires the lease at most TTL after A's last keepalive, and
	// finds expired leases every 500ms.
	const slack = 1500 * time.Millisecond
	var gb driver.Grant
	for {
		gb, err = b.TryAcquire(ctx, reqTTL("ttl-kill", "B", ttl))
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrLocked) {
			t.Fatal(err)
		}
		if time.Since(killed) > ttl+slack {
			t.Fatalf("lock of a holder killed %v ago with TTL %v is still held", time.Since(killed).Round(time.Millisecond), ttl)
		}
		time.Sleep(20 * time.Millisecond) // the pace of the polls
	}
	t.Logf("free %v after the holder with TTL %v was killed", time.Since(killed).Round(time.Millisecond), ttl)
	if gb.Token <= ga.Token {
		t.Fatalf("token %d after %d", gb.Token, ga.Token)
	}
	b.Release(ctx, queuetest.Lease("ttl-kill", "B", gb))
}

// TestGrantTTLIsTheServers: the lease of a grant has the TTL asked for,
// rounded up to whole seconds, or the server's minimum if that is more; and
// Grant.TTL is what the server granted (finding 2).
func TestGrantTTLIsTheServers(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	for _, tc := range []struct {
		ask, want time.Duration
	}{
		{time.Second, serverMinTTL}, // raised by the server
		{3 * time.Second, 3 * time.Second},
		{3500 * time.Millisecond, 4 * time.Second}, // rounded up, never down
		{0, DefaultSessionTTL},                     // no TTL: the driver's default
	} {
		g, err := d.TryAcquire(ctx, reqTTL("ttl-grant", "A", tc.ask))
		if err != nil {
			t.Fatal(err)
		}
		_, granted := keyLease(t, cli, g)
		if granted != tc.want || g.TTL != granted {
			t.Errorf("TTL %v: lease granted %v, Grant.TTL %v; want both %v", tc.ask, granted, g.TTL, tc.want)
		}
		if g.Sent.IsZero() || time.Since(g.Sent) > 5*time.Second {
			t.Errorf("TTL %v: Grant.Sent %v", tc.ask, g.Sent)
		}
		if _, err := d.Release(ctx, queuetest.Lease("ttl-grant", "A", g)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.TryAcquire(ctx, reqTTL("ttl-grant", "A", -time.Second)); err == nil {
		t.Fatal("negative TTL accepted")
	}
	if got := d.Limits().TTLGranularity; got != time.Second {
		t.Fatalf("Limits().TTLGranularity = %v, want 1s", got)
	}
}

// TestOneLeasePerTTL: locks with the same TTL share a lease, a lock with
// another TTL gets its own, and losing one lease ends only the grants on it.
func TestOneLeasePerTTL(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	g2a, err := d.TryAcquire(ctx, reqTTL("ttl-two-a", "A", 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g3, err := d.TryAcquire(ctx, reqTTL("ttl-three", "A", 3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g2b, err := d.TryAcquire(ctx, reqTTL("ttl-two-b", "B", 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	id2a, ttl2 := keyLease(t, cli, g2a)
	id2b, _ := keyLease(t, cli, g2b)
	id3, ttl3 := keyLease(t, cli, g3)
	if id2a != id2b || id2a == id3 {
		t.Fatalf("leases: 2s locks on %x and %x, 3s lock on %x; want one lease per TTL", int64(id2a), int64(id2b), int64(id3))
	}
	if ttl2 != 2*time.Second || ttl3 != 3*time.Second || g2a.TTL != ttl2 || g3.TTL != ttl3 {
		t.Fatalf("granted TTLs %v and %v, Grant.TTL %v and %v; want 2s and 3s", ttl2, ttl3, g2a.TTL, g3.TTL)
	}
	if n := len(d.liveSessions()); n != 2 {
		t.Fatalf("driver has %d leases, want 2", n)
	}

	// The 2s lease ends: its two grants are lost, the 3s grant is not.
	if _, err := cli.Revoke(ctx, id2a); err != nil {
		t.Fatal(err)
	}
	for _, g := range []driver.Grant{g2a, g2b} {
		select {
		case <-g.Lost:
			if !errors.Is(g.Cause(), driver.ErrSessionLost) {
				t.Fatalf("Cause = %v", g.Cause())
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Lost not closed after its lease was revoked")
		}
	}
	select {
	case <-g3.Lost:
		t.Fatalf("the 3s grant was lost with the 2s lease: %v", g3.Cause())
	default:
	}
	errs, err := d.Renew(ctx, []driver.Lease{queuetest.Lease("ttl-two-a", "A", g2a), queuetest.Lease("ttl-three", "A", g3)})
	if err != nil || !errors.Is(errs[0], driver.ErrNotHeld) || errs[1] != nil {
		t.Fatalf("Renew after the 2s lease ended: %v, %v; want [ErrNotHeld nil]", errs, err)
	}
	// A later 2s lock gets a new lease.
	g, err := d.TryAcquire(ctx, reqTTL("ttl-two-a", "A", 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := keyLease(t, cli, g); id == id2a || id == id3 {
		t.Fatalf("new 2s lock on lease %x", int64(id))
	}

	// Close revokes every lease.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ttl-two-a", "ttl-two-b", "ttl-three"} {
		if ks := keys(t, cli, name+"/"); len(ks) != 0 {
			t.Fatalf("keys after Close: %q", ks)
		}
	}
}

// TestRenewKeepsTheLeaseTTL: an etcd lease's TTL is fixed, so a Renew
// asking for another TTL is refused for that lock (ErrUnsupported) rather
// than reported as done; the lock stays held with its TTL.
func TestRenewKeepsTheLeaseTTL(t *testing.T) {
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	g, err := d.TryAcquire(ctx, reqTTL("ttl-renew", "A", time.Second)) // granted 2s
	if err != nil {
		t.Fatal(err)
	}
	l := queuetest.Lease("ttl-renew", "A", g)
	for _, ttl := range []time.Duration{0, time.Second, 500 * time.Millisecond, serverMinTTL} {
		l.TTL = ttl
		if errs, err := d.Renew(ctx, []driver.Lease{l}); err != nil || errs[0] != nil {
			t.Fatalf("Renew with TTL %v (asked 1s, granted %v): %v %v", ttl, g.TTL, errs, err)
		}
	}
	l.TTL = 30 * time.Second
	errs, err := d.Renew(ctx, []driver.Lease{l})
	if err != nil || !errors.Is(errs[0], driver.ErrUnsupported) {
		t.Fatalf("Renew with another TTL: %v %v; want ErrUnsupported", errs, err)
	}
	l.TTL = g.TTL
	if errs, err := d.Renew(ctx, []driver.Lease{l}); err != nil || errs[0] != nil {
		t.Fatalf("Renew after the refused one: %v %v", errs, err)
	}
}

// TestReleaseRetriedAfterUnknownOutcome: a Release that failed before its
// delete reached the server may be retried. Meanwhile the same owner on the
// same driver asks for the lock again: it must queue behind the grant whose
// release is pending, never adopt that grant's key, which the retried release
// then deletes under it (finding 3).
func TestReleaseRetriedAfterUnknownOutcome(t *testing.T) {
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	be := backend(t)
	ctx := queuetest.Ctx(t, 20*time.Second)
	g1, err := d.TryAcquire(ctx, queuetest.Req("rel-retry", "A"))
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Release(cancelled, queuetest.Lease("rel-retry", "A", g1)); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release on a cancelled context: %v, want an unknown outcome", err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := d.Acquire(ctx, queuetest.Req("rel-retry", "A"))
		got <- result{g, err}
	}()
	var early *result
	queuetest.Eventually(t, 5*time.Second, "second acquire queued", func() bool {
		select {
		case r := <-got:
			early = &r
			return true
		default:
			return len(be.Queue(t, "rel-retry")) == 2
		}
	})
	if early != nil {
		t.Fatalf("acquire while the release of token %d is pending returned at once: token %d, %v", g1.Token, early.g.Token, early.err)
	}
	// The retried release deletes the first grant's key, and only it.
	if n, err := d.Release(ctx, queuetest.Lease("rel-retry", "A", g1)); err != nil || n != 0 {
		t.Fatalf("retried Release = %d, %v", n, err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Token <= g1.Token || r.g.Count != 1 {
		t.Fatalf("grant after the retried release: %+v after token %d", r.g, g1.Token)
	}
	// Once more: the first grant is gone, its release says so and touches
	// nothing.
	if _, err := d.Release(ctx, queuetest.Lease("rel-retry", "A", g1)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("third Release of the first grant: %v, want ErrNotHeld", err)
	}
	if errs, err := d.Renew(ctx, []driver.Lease{queuetest.Lease("rel-retry", "A", r.g)}); err != nil || errs[0] != nil {
		t.Fatalf("the new grant after the old one's releases: %v %v", errs, err)
	}
	if n, err := d.Release(ctx, queuetest.Lease("rel-retry", "A", r.g)); err != nil || n != 0 {
		t.Fatalf("Release of the new grant = %d, %v", n, err)
	}
}

// TestClientTTLReachesTheLease: through the dlock package, a Mutex's TTL of
// 1.5s becomes an etcd lease of 2s (rounded up by the driver's Limits), and
// the Lease's validity follows it, not a driver-wide session TTL.
func TestClientTTLReachesTheLease(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d, err := New(newClient(t, shared.Endpoints()), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(d, &dlock.Options{TTL: 1500 * time.Millisecond})
	defer c.Close()
	ctx := queuetest.Ctx(t, 10*time.Second)
	l, err := c.NewMutex("ttl-client", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := l.ValidFor(); v <= 0 || v > 2*time.Second {
		t.Fatalf("ValidFor = %v, want at most 2s", v)
	}
	resp, err := cli.Get(ctx, "ttl-client/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("keys: %v %v", resp, err)
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 2 {
		t.Fatalf("lease: %+v, %v; want a granted TTL of 2s", ttl, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUnrenewedGrantIsFreed: a lease whose renewal is off ends in the dlock
// package after its TTL, and its Unlock then no longer reaches the driver;
// the lock must be freed about one TTL after it was last confirmed, not kept
// by the driver's keepalive until the holder's Client closes. A grant that
// is renewed stays.
func TestUnrenewedGrantIsFreed(t *testing.T) {
	const ttl = 2 * time.Second
	da, err := New(newClient(t, shared.Endpoints()), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := dlock.New(da, &dlock.Options{TTL: ttl})
	defer a.Close()
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)

	// A driver-level grant renewed every 500ms outlives its TTL.
	gk, err := d.TryAcquire(ctx, reqTTL("reap-kept", "K", ttl))
	if err != nil {
		t.Fatal(err)
	}
	l, err := a.NewMutex("reap", &dlock.MutexOptions{RenewInterval: -1}).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	renewUntil := taken.Add(3 * ttl)
	// K is renewed from the start: its grant came first, so it would be
	// reaped unrenewed before l's lease ends if it waited for that.
	for lost := false; !lost; {
		if errs, err := d.Renew(ctx, []driver.Lease{queuetest.Lease("reap-kept", "K", gk)}); err != nil || errs[0] != nil {
			t.Fatalf("renewed grant while the other runs out: %v %v", errs, err)
		}
		select {
		case <-l.Done():
			lost = true
		case <-time.After(500 * time.Millisecond): // the pace of renewals
		}
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of the expired lease: %v, want ErrNotHeld", err)
	}
	// The keepalive loop ticks every TTL/3.
	const slack = ttl/3 + time.Second
	var g driver.Grant
	for {
		if time.Now().Before(renewUntil) {
			ls := []driver.Lease{queuetest.Lease("reap-kept", "K", gk)}
			if g.Token != 0 {
				ls = append(ls, queuetest.Lease("reap", "B", g))
			}
			errs, err := d.Renew(ctx, ls)
			if err != nil {
				t.Fatal(err)
			}
			for _, err := range errs {
				if err != nil {
					t.Fatalf("renewed grant: %v", err)
				}
			}
		}
		if g.Token == 0 {
			g, err = d.TryAcquire(ctx, reqTTL("reap", "B", ttl))
			switch {
			case err == nil:
				t.Logf("free %v after it was taken with TTL %v and never renewed", time.Since(taken).Round(time.Millisecond), ttl)
			case !errors.Is(err, driver.ErrLocked):
				t.Fatal(err)
			case time.Since(taken) > ttl+slack:
				t.Fatalf("lock whose lease ended %v ago is still held", time.Since(taken).Round(time.Millisecond))
			}
		}
		if g.Token != 0 && !time.Now().Before(renewUntil) {
			break
		}
		time.Sleep(500 * time.Millisecond) // the pace of renewals and polls
	}
	if _, err := d.Release(ctx, queuetest.Lease("reap", "B", g)); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Release(ctx, queuetest.Lease("reap-kept", "K", gk)); err != nil || n != 0 {
		t.Fatalf("Release of the renewed grant after %v: %d, %v", time.Since(taken).Round(time.Millisecond), n, err)
	}
}

// TestQueueKeysAreReused: the grants of one lease on one name reuse the key
// of the lowest free slot, whatever their owner (dlock's default owner is
// random per Lock), so etcd's index does not grow with every Lock of a name;
// a waiter behind a holder on the same lease gets a key of its own, and a
// refused TryAcquire frees its slot.
func TestQueueKeysAreReused(t *testing.T) {
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	keyOf := func(g driver.Grant) string { return g.Handle.(*handle).key }
	release := func(owner string, g driver.Grant) {
		t.Helper()
		if _, err := d.Release(ctx, queuetest.Lease("reuse", owner, g)); err != nil {
			t.Fatalf("Release %s: %v", owner, err)
		}
	}
	var first string
	for i := range 20 {
		owner := fmt.Sprintf("owner-%d", i)
		g, err := d.TryAcquire(ctx, queuetest.Req("reuse", owner))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = keyOf(g)
		} else if k := keyOf(g); k != first {
			t.Fatalf("grant %d has key %q, the first had %q: a new key per Lock", i, k, first)
		}
		release(owner, g)
	}
	ga, err := d.TryAcquire(ctx, queuetest.Req("reuse", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, queuetest.Req("reuse", "B")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire of B while A holds: %v, want ErrLocked", err)
	}
	type result struct {
		g   driver.Grant
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := d.Acquire(ctx, queuetest.Req("reuse", "C"))
		got <- result{g, err}
	}()
	queuetest.Eventually(t, 5*time.Second, "C queued", func() bool { return len(keys(t, d.cli, d.queuePrefix("reuse"))) == 2 })
	release("A", ga)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if keyOf(r.g) == keyOf(ga) || keyOf(r.g) == first {
		t.Fatalf("C waited behind A on the same lease with key %q, A's was %q", keyOf(r.g), keyOf(ga))
	}
	if r.g.Token <= ga.Token {
		t.Fatalf("token %d after %d", r.g.Token, ga.Token)
	}
	release("C", r.g)
	g, err := d.TryAcquire(ctx, queuetest.Req("reuse", "D"))
	if err != nil {
		t.Fatal(err)
	}
	if keyOf(g) != first {
		t.Fatalf("after every release the key is %q, want the first slot's %q again", keyOf(g), first)
	}
	release("D", g)
	if ks := keys(t, d.cli, d.queuePrefix("reuse")); len(ks) != 0 {
		t.Fatalf("keys left: %q", ks)
	}
}

// TestSlotOfUnknownReleaseIsNotReused: Release deletes a key without a
// create-revision guard, so a key whose delete had an unknown outcome (a
// request that may still reach the server) must never be put again for a
// later grant, even after a retried Release deleted it.
func TestSlotOfUnknownReleaseIsNotReused(t *testing.T) {
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	g1, err := d.TryAcquire(ctx, queuetest.Req("stale-slot", "A"))
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.Release(cancelled, queuetest.Lease("stale-slot", "A", g1)); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release on a cancelled context: %v, want an unknown outcome", err)
	}
	if _, err := d.Release(ctx, queuetest.Lease("stale-slot", "A", g1)); err != nil {
		t.Fatalf("retried Release: %v", err)
	}
	for range 3 {
		g2, err := d.TryAcquire(ctx, queuetest.Req("stale-slot", "B"))
		if err != nil {
			t.Fatal(err)
		}
		if k1, k2 := g1.Handle.(*handle).key, g2.Handle.(*handle).key; k1 == k2 {
			t.Fatalf("a later grant reuses key %q, whose delete had an unknown outcome", k2)
		}
		if _, err := d.Release(ctx, queuetest.Lease("stale-slot", "B", g2)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.Release(ctx, queuetest.Lease("stale-slot", "A", g1)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("third Release of the first grant: %v, want ErrNotHeld", err)
	}
}

// TestLatePutOfAnEarlierAttemptIsRemoved: a put whose outcome was unknown
// may reach the server after its discard found nothing. The key names the
// driver's lease and a free slot, so the next acquire on that slot removes
// it rather than leave it blocking the lock while the lease lives.
func TestLatePutOfAnEarlierAttemptIsRemoved(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	g, err := d.TryAcquire(ctx, queuetest.Req("late-put", "A"))
	if err != nil {
		t.Fatal(err)
	}
	hd := g.Handle.(*handle)
	if _, err := d.Release(ctx, queuetest.Lease("late-put", "A", g)); err != nil {
		t.Fatal(err)
	}
	// The late put, on the driver's lease at the free slot.
	if _, err := cli.Put(ctx, hd.key, "A", clientv3.WithLease(hd.sess.id)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, queuetest.Req("late-put", "B")); err == nil {
		t.Fatal("TryAcquire over the late put succeeded")
	}
	queuetest.Eventually(t, 5*time.Second, "late put removed", func() bool { return len(keys(t, cli, d.queuePrefix("late-put"))) == 0 })
	g, err = d.TryAcquire(ctx, queuetest.Req("late-put", "B"))
	if err != nil {
		t.Fatalf("TryAcquire after the late put was removed: %v", err)
	}
	if _, err := d.Release(ctx, queuetest.Lease("late-put", "B", g)); err != nil {
		t.Fatal(err)
	}
}
