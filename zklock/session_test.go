package zklock

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
)

// openURL opens a driver from rawURL, closed when t ends.
func openURL(t testing.TB, rawURL string) *Driver {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return queuetest.Open(t, func() (*Driver, error) {
		d, err := OpenURL(queuetest.Ctx(t, 30*time.Second), u)
		if err != nil {
			return nil, err
		}
		return d.(*Driver), nil
	})
}

func ttlReq(name, owner string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Name: name, Owner: owner, TTL: ttl}
}

// grantTime is when g's validity starts, as the dlock package counts it.
func grantTime(g driver.Grant, called time.Time) time.Time {
	if !g.Sent.IsZero() {
		return g.Sent
	}
	return called
}

// TestNegotiatedSessionTimeout (audit finding 2): a server whose
// maxSessionTimeout is 3s grants a session asked for 10s only 3s. The grant
// must say 3s, so that the holder's validity ends before the server expires
// its session and hands the lock to the next in line; a lock asking for 10s
// is refused, naming the bound.
func TestNegotiatedSessionTimeout(t *testing.T) {
	// maxSessionTimeout is 300 ticks: 3s.
	c := testserver.ZooKeeperWith(t, 1, &testserver.ZooKeeperOptions{TickTime: 10 * time.Millisecond})
	const granted = 3 * time.Second
	p, err := newProxy(c.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	a := openURL(t, "zk://"+p.addr()+"?session_timeout=10s")
	b := newTestDriver(t, c.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 30*time.Second)

	// A TTL above the server's maximum is refused, naming the bound. (Were
	// it granted, the check below would find two holders.)
	called := time.Now()
	ga, err := a.TryAcquire(ctx, ttlReq("neg", "A", 10*time.Second))
	if err == nil {
		t.Errorf("TTL 10s above the server's 3s maximum granted with Grant.TTL %v, want ErrInvalid", ga.TTL)
	} else if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), granted.String()) {
		t.Errorf("TTL 10s above the server's 3s maximum: %v, want ErrInvalid naming 3s", err)
	}
	if err != nil {
		called = time.Now()
		if ga, err = a.TryAcquire(ctx, ttlReq("neg", "A", granted)); err != nil {
			t.Fatal(err)
		}
		if ga.TTL != granted {
			t.Errorf("Grant.TTL = %v, want the negotiated session timeout %v", ga.TTL, granted)
		}
	}
	validUntil := grantTime(ga, called).Add(ga.TTL)

	got := make(chan error, 1)
	go func() {
		g, err := b.Acquire(ctx, ttlReq("neg", "B", granted))
		if err == nil && time.Now().Before(validUntil) {
			err = errors.New("B was granted " + time.Until(validUntil).String() + " before A's validity ended: two holders")
		}
		if err == nil {
			b.Release(context.Background(), queuetest.Lease("neg", "B", g))
		}
		got <- err
	}()
	admin := newConn(t, c.Endpoints())
	queuetest.Eventually(t, 10*time.Second, "B queued", func() bool { return len(children(t, admin, "/dlock/neg")) == 2 })
	p.close() // A is cut off: its session expires on the server
	select {
	case err := <-got:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("B not granted after A's session expired")
	}
}

// TestTTLClasses (audit finding 4): each TTL gets a session with that
// timeout, so a holder that vanishes keeps a 1s lock about 1s, not for the
// timeout of some other session; TTLs the ensemble cannot grant, re-entry
// with another TTL and Extend to another TTL are refused, never replaced.
func TestTTLClasses(t *testing.T) {
	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	d := openURL(t, "zk://"+p.addr()) // its first session asks for 30s
	ctx := queuetest.Ctx(t, 30*time.Second)

	g1, err := d.TryAcquire(ctx, ttlReq("ttl1", "A", time.Second))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx, ttlReq("ttl2", "A", 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if g1.TTL != time.Second || g2.TTL != 2*time.Second {
		t.Errorf("Grant.TTL = %v and %v, want 1s and 2s", g1.TTL, g2.TTL)
	}
	s1, s2 := g1.Handle.(*handle).sess, g2.Handle.(*handle).sess
	if s1 == s2 || s1.id == s2.id || s1.ttl != time.Second || s2.ttl != 2*time.Second {
		t.Errorf("sessions %#x (%v) and %#x (%v): want one per TTL", s1.id, s1.ttl, s2.id, s2.ttl)
	}

	// Re-entry with another TTL and Extend to another TTL are refused.
	if _, err := d.TryAcquire(ctx, ttlReq("ttl1", "A", 2*time.Second)); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("re-entry with another TTL: %v, want ErrInvalid", err)
	}
	l1 := queuetest.Lease("ttl1", "A", g1)
	l1.TTL = 5 * time.Second
	if errs, err := d.Renew(ctx, []driver.Lease{l1}); err != nil || !errors.Is(errs[0], driver.ErrUnsupported) {
		t.Errorf("Renew to another TTL: %v %v, want ErrUnsupported", errs, err)
	}
	// Below the ensemble's minimum (2 ticks: 400ms): refused, naming both
	// bounds (its maximum is 300 ticks: 1m0s).
	_, err = d.TryAcquire(ctx, ttlReq("ttl0", "A", 100*time.Millisecond))
	if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "400ms") || !strings.Contains(err.Error(), "1m0s") {
		t.Errorf("TTL 100ms: %v, want ErrInvalid naming 400ms and 1m0s", err)
	}

	// The holder vanishes: the 1s lock is free about 1s later.
	other := newTestDriver(t, shared.Endpoints(), nil)
	got := make(chan error, 1)
	go func() {
		g, err := other.Acquire(ctx, ttlReq("ttl1", "B", time.Second))
		if err == nil {
			other.Release(context.Background(), queuetest.Lease("ttl1", "B", g))
		}
		got <- err
	}()
	admin := newConn(t, shared.Endpoints())
	queuetest.Eventually(t, 10*time.Second, "B queued", func() bool { return len(children(t, admin, "/dlock/ttl1")) == 2 })
	cut := time.Now()
	p.close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("TTL 1s lock free %v after its holder vanished", time.Since(cut).Round(time.Millisecond))
		if time.Since(cut) > 4*time.Second {
			t.Errorf("TTL 1s lock free only %v after its holder vanished", time.Since(cut))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("TTL 1s lock still held 15s after its holder vanished")
	}
}

// openSockets counts the process's open sockets.
func openSockets(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot list open files: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// TestCloseAfterExpiryLeavesNoSocket (audit finding 9): a client cut off
// past its session timeout reconnects, is told its session expired, and
// starts a new one. go-zookeeper leaves the socket that carried the refusal
// open; Close must leave no socket behind.
func TestCloseAfterExpiryLeavesNoSocket(t *testing.T) {
	admin := newConn(t, shared.Endpoints())
	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	before := openSockets(t)
	d := openURL(t, "zk://"+p.addr()+"?session_timeout=1s")
	ctx := queuetest.Ctx(t, 30*time.Second)
	g, err := d.TryAcquire(ctx, ttlReq("leak", "A", time.Second))
	if err != nil {
		t.Fatal(err)
	}
	conn := g.Handle.(*handle).sess.l.conn
	old := conn.SessionID()
	addr := p.addr()
	p.close()
	queuetest.Eventually(t, 10*time.Second, "session expired on the server", func() bool {
		return len(children(t, admin, "/dlock/leak")) == 0
	})
	p2, err := newProxyAt(addr, shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p2.close()
	queuetest.Eventually(t, 10*time.Second, "a new session", func() bool {
		id := conn.SessionID()
		return id != 0 && id != old && conn.State() == zk.StateHasSession
	})
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	queuetest.Eventually(t, 5*time.Second, "the sockets opened since Open to close", func() bool {
		return openSockets(t) <= before
	})
}

// TestReleaseRetry (audit finding 3, driver side): a Release whose outcome
// is unknown may be called again. A nested release is counted once; a last
// release, repeated, reports success or ErrNotHeld and never touches the
// next holder's node.
func TestReleaseRetry(t *testing.T) {
	be := backend(t)
	d := newTestDriver(t, shared.Endpoints(), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	g1, err := d.TryAcquire(ctx, queuetest.Req("rr", "A"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.Acquire(ctx, queuetest.Req("rr", "A"))
	if err != nil || g2.Count != 2 {
		t.Fatalf("re-entry: %+v %v", g2, err)
	}
	if _, err := d.Release(cancelled, queuetest.Lease("rr", "A", g2)); err == nil {
		t.Fatal("Release on a cancelled context succeeded")
	}
	if n, err := d.Release(ctx, queuetest.Lease("rr", "A", g2)); err != nil || n != 1 {
		t.Fatalf("nested Release again after an unknown outcome = %d, %v; want 1 hold left", n, err)
	}
	if q := be.Queue(t, "rr"); len(q) != 1 {
		t.Fatalf("queue %q: the node must stay while a hold remains", q)
	}
	if n, err := d.Release(ctx, queuetest.Lease("rr", "A", g1)); err != nil || n != 0 {
		t.Fatalf("last Release = %d, %v", n, err)
	}

	// A last release whose outcome is unknown, repeated.
	g3, err := d.TryAcquire(ctx, queuetest.Req("rr", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Release(cancelled, queuetest.Lease("rr", "A", g3)); err == nil {
		t.Fatal("Release on a cancelled context succeeded")
	}
	if _, err := d.Release(ctx, queuetest.Lease("rr", "A", g3)); err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release again: %v, want success or ErrNotHeld", err)
	}
	other := newTestDriver(t, shared.Endpoints(), nil)
	gb, err := other.Acquire(ctx, queuetest.Req("rr", "B"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Release(ctx, queuetest.Lease("rr", "A", g3)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release once more, with B holding: %v, want ErrNotHeld", err)
	}
	if errs, err := other.Renew(ctx, []driver.Lease{queuetest.Lease("rr", "B", gb)}); err != nil || errs[0] != nil {
		t.Fatalf("B's grant after A's repeated releases: %v %v", errs, err)
	}
	other.Release(ctx, queuetest.Lease("rr", "B", gb))
}

// TestNewServesItsSessionTimeoutOnly: a driver over the caller's connection
// serves only Options.SessionTimeout; another TTL is refused, not replaced.
func TestNewServesItsSessionTimeoutOnly(t *testing.T) {
	conn := newConn(t, shared.Endpoints())
	d := queuetest.Open(t, func() (*Driver, error) { return New(conn, &Options{SessionTimeout: testSession}) })
	ctx := queuetest.Ctx(t, 10*time.Second)
	_, err := d.TryAcquire(ctx, ttlReq("new", "A", 30*time.Second))
	if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), testSession.String()) {
		t.Fatalf("TTL 30s on a %v connection: %v, want ErrInvalid naming %v", testSession, err, testSession)
	}
	g, err := d.TryAcquire(ctx, ttlReq("new", "A", testSession))
	if err != nil || g.TTL != testSession {
		t.Fatalf("TTL %v: %+v %v", testSession, g, err)
	}
	if n, err := d.Release(ctx, queuetest.Lease("new", "A", g)); err != nil || n != 0 {
		t.Fatalf("Release = %d, %v", n, err)
	}
}

// TestTokenFromCreateReply: on the driver's own connections the token (the
// node's czxid) comes from the create's reply, so an acquire sends no
// Exists; over a connection passed to New (no sniffer) the node's stat is
// read. Either way the token is the node's czxid.
func TestTokenFromCreateReply(t *testing.T) {
	conn := newConn(t, shared.Endpoints())
	ctx := queuetest.Ctx(t, 20*time.Second)
	check := func(d *Driver, name string) {
		t.Helper()
		for range 5 {
			g, err := d.TryAcquire(ctx, ttlReq(name, "A", testSession))
			if err != nil {
				t.Fatal(err)
			}
			hd := g.Handle.(*handle)
			ok, st, err := conn.Exists(hd.path)
			if err != nil || !ok {
				t.Fatalf("Exists %s: %v %v", hd.path, ok, err)
			}
			if g.Token != uint64(st.Czxid) || st.EphemeralOwner != hd.sess.id {
				t.Fatalf("token %d, session %#x; the node has czxid %d, owner %#x", g.Token, hd.sess.id, st.Czxid, st.EphemeralOwner)
			}
			if _, err := d.Release(ctx, queuetest.Lease(name, "A", g)); err != nil {
				t.Fatal(err)
			}
		}
	}
	own := newTestDriver(t, shared.Endpoints(), nil)
	check(own, "czxid-own")
	if n := own.stats.Load(); n != 0 {
		t.Fatalf("%d stat reads on the driver's own connection, want 0", n)
	}
	given := queuetest.Open(t, func() (*Driver, error) {
		return New(newConn(t, shared.Endpoints()), &Options{SessionTimeout: testSession})
	})
	check(given, "czxid-given")
	if n := given.stats.Load(); n != 5 {
		t.Fatalf("%d stat reads on a connection passed to New, want 5", n)
	}
}
