package etcdlock

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"

	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestKinds runs the read/write lock and semaphore tests shared with zklock.
func TestKinds(t *testing.T) {
	be := backend(t)
	// A crash: no keepalive, no revoke; the keys and their lock-delay
	// guards expire with their leases.
	be.Kill = func(t testing.TB, qd queuetest.Driver) {
		d := qd.(*Driver)
		d.stop()
		d.cli.Close()
	}
	queuetest.RunKinds(t, be)
}

// TestKindsLeaseLoss: a lease that ends ends the grants of every kind bound
// to it (Lost closes with ErrSessionLost), and Renew reports them gone.
func TestKindsLeaseLoss(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	d := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
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
	if _, err := cli.Revoke(ctx, onlySession(t, d).id); err != nil {
		t.Fatal(err)
	}
	for i, g := range grants {
		select {
		case <-g.Lost:
			if !errors.Is(g.Cause(), driver.ErrSessionLost) {
				t.Fatalf("%v: Cause = %v", reqs[i].Kind, g.Cause())
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: Lost not closed after the lease was revoked", reqs[i].Kind)
		}
	}
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
			t.Fatalf("%v: Renew after the lease ended: %v", reqs[i].Kind, e)
		}
	}
}
