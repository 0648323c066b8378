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

// TestTryAcquireMulti: one transaction takes every name or none; a busy
// name (held by dlock or by etcdctl's layout) or a lock-delay guard refuses
// the set and leaves no key behind; a name the driver holds for the owner
// already makes it ErrUnsupported (the dlock package then goes one by one).
func TestTryAcquireMulti(t *testing.T) {
	cli := newClient(t, shared.Endpoints())
	a, b := newTestDriver(t, newClient(t, shared.Endpoints()), nil), newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	ctx := queuetest.Ctx(t, 20*time.Second)
	reqs := func(owner string, names ...string) []driver.AcquireRequest {
		var rs []driver.AcquireRequest
		for _, n := range names {
			rs = append(rs, queuetest.Req(n, owner))
		}
		return rs
	}
	gs, err := a.TryAcquireMulti(ctx, reqs("A", "m1/a", "m1/b", "m1/c"))
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		if g.Token == 0 || g.Count != 1 || g.Lost == nil {
			t.Fatalf("grant %d: %+v", i, g)
		}
	}
	// Each name is held: a single TryAcquire of another owner fails.
	if _, err := b.TryAcquire(ctx, queuetest.Req("m1/b", "B")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire of a name taken by a multi-acquire: %v", err)
	}
	// One busy name: nothing taken.
	if _, err := b.TryAcquireMulti(ctx, reqs("B", "m1/x", "m1/c", "m1/y")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("multi-acquire with a busy name: %v, want ErrLocked", err)
	}
	for _, n := range []string{"m1/x", "m1/y"} {
		if ks := keys(t, cli, (&Driver{}).queuePrefix(n)); len(ks) != 0 {
			t.Fatalf("refused multi-acquire left %q", ks)
		}
	}
	// A re-entry goes one by one.
	if _, err := a.TryAcquireMulti(ctx, reqs("A", "m1/a", "m1/z")); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("multi-acquire of a name held by the owner: %v, want ErrUnsupported", err)
	}
	if ks := keys(t, cli, (&Driver{}).queuePrefix("m1/z")); len(ks) != 0 {
		t.Fatalf("unsupported multi-acquire left %q", ks)
	}
	for i, r := range reqs("A", "m1/a", "m1/b", "m1/c") {
		if n, err := a.Release(ctx, queuetest.Lease(r.Name, r.Owner, gs[i])); err != nil || n != 0 {
			t.Fatalf("Release %q = %d, %v", r.Name, n, err)
		}
	}
	// With lock-delay: guards are written with the keys, and a lost
	// holder's guard refuses the set.
	rs := reqs("A", "m1/a", "m1/b")
	for i := range rs {
		rs[i].LockDelay = 3 * time.Second
	}
	gs, err = a.TryAcquireMulti(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, gs[1].Handle.(*handle).key); err != nil { // lost, guard stays
		t.Fatal(err)
	}
	if _, err := b.TryAcquireMulti(ctx, reqs("B", "m1/b", "m1/q")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("multi-acquire inside a lost holder's lock-delay: %v, want ErrLocked", err)
	}
	if n, err := a.Release(ctx, queuetest.Lease("m1/a", "A", gs[0])); err != nil || n != 0 {
		t.Fatalf("Release = %d, %v", n, err)
	}
	if ks := keys(t, cli, (&Driver{}).guardKey("m1/a")); len(ks) != 0 {
		t.Fatalf("guard left after a release: %q", ks)
	}
}
