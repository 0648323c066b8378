package zklock

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"

	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestKinds runs the read/write lock and semaphore tests shared with
// etcdlock.
func TestKinds(t *testing.T) {
	be := backend(t)
	// The driver stops without releasing anything; closing its sessions
	// deletes its ephemeral nodes and leaves its lock-delay guards.
	be.Kill = func(t testing.TB, qd queuetest.Driver) { qd.(*Driver).Close() }
	queuetest.RunKinds(t, be)
}

// TestKindsSessionExpiry: a session that expires ends the grants of every
// kind made in it (Lost closes with ErrSessionLost), and Renew reports them
// gone.
func TestKindsSessionExpiry(t *testing.T) {
	p, err := newProxy(shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	d := newTestDriver(t, []string{p.addr()}, nil)
	ctx := queuetest.Ctx(t, 30*time.Second)
	var reqs []driver.AcquireRequest
	var grants []driver.Grant
	for _, r := range []driver.AcquireRequest{
		queuetest.KindReq(driver.Read, "t20", "A", 0),
		queuetest.KindReq(driver.Write, "t20w", "A", 0),
		queuetest.KindReq(driver.Permit, "t20", "A", 2),
	} {
		g, err := d.TryAcquire(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		reqs, grants = append(reqs, r), append(grants, g)
	}
	addr := p.addr()
	p.close()
	for i, g := range grants {
		select {
		case <-g.Lost:
			if !errors.Is(g.Cause(), driver.ErrSessionLost) {
				t.Fatalf("%v: Cause = %v", reqs[i].Kind, g.Cause())
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%v: Lost not closed after the session expired", reqs[i].Kind)
		}
	}
	p2, err := newProxyAt(addr, shared.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p2.close()
	ls := make([]driver.Lease, len(grants))
	for i := range grants {
		ls[i] = queuetest.KindLease(reqs[i], grants[i])
	}
	errs, err := d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if !errors.Is(e, driver.ErrNotHeld) {
			t.Fatalf("%v: Renew after expiry: %v", reqs[i].Kind, e)
		}
	}
}
