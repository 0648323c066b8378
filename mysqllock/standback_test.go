package mysqllock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestStandBack: in every mode, a driver that releases a lock it
// was lately refused by the server (another driver competes for it) holds
// its own next attempt back for a moment, so the other contender gets the
// lock rather than the releaser looping back; once a stand-back gave the
// lock to nobody (the releaser's next grant follows its previous token),
// the releaser stops standing back, and a driver that was never refused
// the name never stands back.
func TestStandBack(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
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
			var standing atomic.Int64 // a's attempts that stood back
			// An attempt that stands back waits on hold, when set, so the
			// test can act within its stand-back however slow the machine.
			var hold atomic.Pointer[chan struct{}]
			a.stand.TestHook = func() {
				standing.Add(1)
				if c := hold.Load(); c != nil {
					<-*c
				}
			}
			name := randomName("standback")
			reqA := driver.AcquireRequest{Name: name, Owner: "a", TTL: time.Minute}
			reqB := driver.AcquireRequest{Name: name, Owner: "b", TTL: time.Minute}
			try := func(d *Driver, req driver.AcquireRequest) (driver.Grant, error) {
				g, err := d.TryAcquire(ctx, req)
				if err != nil && !errors.Is(err, driver.ErrLocked) {
					t.Errorf("%s: %v", req.Owner, err)
				}
				return g, err
			}
			take := func(d *Driver, req driver.AcquireRequest) driver.Grant {
				t.Helper()
				g, err := try(d, req)
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

			// Never refused: a release and an immediate re-take.
			release(a, reqA, take(a, reqA))
			release(a, reqA, take(a, reqA))
			if n := standing.Load(); n != 0 {
				t.Fatalf("a driver never refused the lock stood back %d times", n)
			}

			// b holds; a is refused by the server; b releases, a takes it.
			gb := take(b, reqB)
			if _, err := try(a, reqA); err == nil {
				t.Fatal("a was granted a lock b holds")
			}
			release(b, reqB, gb)
			ga := take(a, reqA)
			release(a, reqA, ga)
			// a was refused a moment ago: its next attempt waits, and b, the
			// other contender, gets the lock meanwhile.
			type result struct {
				g   driver.Grant
				err error
			}
			res := make(chan result, 1)
			held := make(chan struct{})
			hold.Store(&held)
			go func() {
				g, err := try(a, reqA)
				res <- result{g, err}
			}()
			testwait.Until(t, 10*time.Second, "a's attempt right after releasing a contended lock to stand back", func() bool { return standing.Load() == 1 })
			gb = take(b, reqB)
			hold.Store(nil)
			close(held)
			if r := <-res; r.err == nil {
				t.Fatalf("a was granted token %d while b holds token %d", r.g.Token, gb.Token)
			}
			release(b, reqB, gb)

			// a was refused again: its grant now (b's release does not make
			// a stand back) and release lead to one more stand-back, which
			// gives the lock to nobody: a's next grant follows its token.
			g1 := take(a, reqA)
			release(a, reqA, g1)
			g2 := take(a, reqA)
			if standing.Load() != 2 || g2.Token != g1.Token+1 {
				t.Fatalf("a stood back %d times, want 2; tokens %d then %d", standing.Load(), g1.Token, g2.Token)
			}
			// So a stops standing back.
			release(a, reqA, g2)
			release(a, reqA, take(a, reqA))
			if n := standing.Load(); n != 2 {
				t.Fatalf("a stood back %d times, want 2: again after a stand-back that gave the lock to nobody", n)
			}
		})
	}
}

// TestStandBackSparesWaiters: a waiting Lock the server refused does not
// stand back when its driver releases the lock: its retry answers the
// wake-up of that very release (here a goroutine of the same driver), and
// it takes the lock at once, while a new Lock of that driver stands back.
// (Both of these drivers' Locks run without their waiting loop, one
// attempt after another.)
func TestStandBackSparesWaiters(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeGetLock} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			h := newTestHarness(t, mode)
			d0, err := h.NewDriver(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer d0.Close()
			d := d0.(*Driver)
			var standing atomic.Int64
			d.stand.TestHook = func() { standing.Add(1) }
			name := randomName("spare")
			holder := driver.AcquireRequest{Name: name, Owner: "holder", TTL: time.Minute, Waiting: true}
			waiter := driver.AcquireRequest{Name: name, Owner: "waiter", TTL: time.Minute, Waiting: true}
			g, err := d.TryAcquire(ctx, holder)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.TryAcquire(ctx, waiter); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("the waiter's first attempt: %v, want ErrLocked", err)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: holder.Owner, Token: g.Token, Handle: g.Handle, TTL: holder.TTL}); err != nil {
				t.Fatal(err)
			}
			gw, err := d.TryAcquire(ctx, waiter)
			if err != nil {
				t.Fatalf("the waiter's retry: %v", err)
			}
			if n := standing.Load(); n != 0 {
				t.Fatalf("the refused waiter's retry stood back (%d)", n)
			}
			// Contended again (late is refused while the waiter holds): a
			// new Lock right after the release stands back.
			late := driver.AcquireRequest{Name: name, Owner: "late", TTL: time.Minute, Waiting: true}
			if _, err := d.TryAcquire(ctx, late); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("late's attempt: %v, want ErrLocked", err)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: waiter.Owner, Token: gw.Token, Handle: gw.Handle, TTL: waiter.TTL}); err != nil {
				t.Fatal(err)
			}
			next := driver.AcquireRequest{Name: name, Owner: "next", TTL: time.Minute, Waiting: true}
			gn, err := d.TryAcquire(ctx, next)
			if err != nil {
				t.Fatal(err)
			}
			if n := standing.Load(); n != 1 {
				t.Fatalf("a new Lock after a contended release stood back %d times, want 1", n)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: name, Owner: next.Owner, Token: gn.Token, Handle: gn.Handle, TTL: next.TTL}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
