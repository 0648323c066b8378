package zklock

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestRenewLargeBatch: a batch of renewMultiMin leases or more is checked
// with multi requests; one whose node was deleted by someone else gets
// ErrNotHeld, every other lease is renewed, and a foreign handle is refused.
func TestRenewLargeBatch(t *testing.T) {
	d := newTestDriver(t, shared.Endpoints(), nil)
	admin := newConn(t, shared.Endpoints())
	ctx := queuetest.Ctx(t, 30*time.Second)
	n := renewMultiMin + 6
	ls := make([]driver.Lease, n)
	paths := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("renew-batch/%d", i)
		g, err := d.TryAcquire(ctx, ttlReq(name, "A", testSession))
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = queuetest.Lease(name, "A", g)
		paths[i] = g.Handle.(*handle).path
	}
	errs, err := d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("lease %d: %v", i, e)
		}
	}
	gone := n / 2
	if err := admin.Delete(paths[gone], -1); err != nil {
		t.Fatal(err)
	}
	ls = append(ls, driver.Lease{Name: "foreign", Owner: "A", Handle: "not a zklock handle"})
	errs, err = d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		switch {
		case i == gone || i == n:
			if !errors.Is(e, driver.ErrNotHeld) {
				t.Fatalf("lease %d: %v, want ErrNotHeld", i, e)
			}
		case e != nil:
			t.Fatalf("lease %d: %v", i, e)
		}
	}
	for i := range n {
		if i == gone {
			continue
		}
		if _, err := d.Release(ctx, ls[i]); err != nil {
			t.Fatal(err)
		}
	}
}
