package mysqllock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestStandBack: in the session modes, a driver that releases a lock it
// was lately refused by the server (another driver competes for it) is
// refused its own next attempt for a moment, without a statement, so the
// waiter the release woke gets the lock rather than the releaser looping
// back; once a stand-back gave the lock to nobody (the releaser's next
// grant follows its previous token), the releaser stops standing back, and
// a driver that was never refused the name never stands back.
func TestStandBack(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			h := newTestHarness(t, mode)
			var ds [2]*Driver
			for i := range ds {
				d, err := h.NewDriver(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				ds[i] = d.(*Driver)
			}
			a, b := ds[0], ds[1]
			name := randomName("standback")
			reqA := driver.AcquireRequest{Name: name, Owner: "a", TTL: time.Minute}
			reqB := driver.AcquireRequest{Name: name, Owner: "b", TTL: time.Minute}
			take := func(d *Driver, req driver.AcquireRequest) driver.Grant {
				t.Helper()
				g, err := d.TryAcquire(ctx, req)
				if err != nil {
					t.Fatalf("%s: %v", req.Owner, err)
				}
				return g
			}
			release := func(d *Driver, req driver.AcquireRequest, g driver.Grant) {
				t.Helper()
				if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL}); err != nil {
					t.Fatal(err)
				}
			}
			standsBack := func(d *Driver, req driver.AcquireRequest) (time.Duration, driver.Grant) {
				t.Helper()
				g, err := d.TryAcquire(ctx, req)
				var le *driver.LockedError
				switch {
				case err == nil:
					return 0, g
				case errors.As(err, &le):
					return le.RetryAfter, driver.Grant{}
				}
				t.Fatal(err)
				return 0, driver.Grant{}
			}

			// Never refused: a release and an immediate re-take.
			g := take(a, reqA)
			release(a, reqA, g)
			if left, g2 := standsBack(a, reqA); left != 0 || g2.Token == 0 {
				t.Fatalf("a driver never refused the lock stood back %v after its release", left)
			} else {
				release(a, reqA, g2)
			}

			// b holds; a is refused by the server; b releases, a takes it.
			gb := take(b, reqB)
			if left, _ := standsBack(a, reqA); left != 0 {
				t.Fatalf("refused by the server with RetryAfter %v, want 0 (the server says nothing of time)", left)
			}
			release(b, reqB, gb)
			ga := take(a, reqA)
			release(a, reqA, ga)
			// a was refused a moment ago: it leaves the lock to others.
			left, _ := standsBack(a, reqA)
			if left <= 0 || left > yieldFor {
				t.Fatalf("a's attempt right after releasing a contended lock: RetryAfter %v, want a stand-back in (0, %v]", left, yieldFor)
			}
			// b, the other contender, gets it meanwhile.
			gb = take(b, reqB)
			release(b, reqB, gb)

			// a still stands back (it has no waiter of its own to see b
			// take the lock): it gets the lock once the stand-back ends.
			var g2 driver.Grant
			testwait.Until(t, 10*time.Second, "a granted after its stand-back", func() bool {
				_, g2 = standsBack(a, reqA)
				return g2.Token != 0
			})
			release(a, reqA, g2)
			// Nobody else took the lock during that stand-back: a's next
			// grant follows its last token, and a stops standing back.
			var ga2 driver.Grant
			testwait.Until(t, 10*time.Second, "a granted after its wasted stand-back", func() bool {
				_, ga2 = standsBack(a, reqA)
				return ga2.Token != 0
			})
			if ga2.Token != g2.Token+1 {
				t.Fatalf("token %d after %d with nobody else granted", ga2.Token, g2.Token)
			}
			ga = ga2
			release(a, reqA, ga)
			if left, g := standsBack(a, reqA); left != 0 || g.Token == 0 {
				t.Fatalf("stood back %v again after a stand-back gave the lock to nobody", left)
			} else {
				release(a, reqA, g)
			}
		})
	}
}
