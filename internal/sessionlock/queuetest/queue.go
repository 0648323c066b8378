package queuetest

import (
	"context"
	"errors"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TryAcquireExcludesAndTokensIncrease: a second driver is refused while the
// first holds, tokens increase from one holder to the next, and a stale
// release never touches the next holder's entry.
func TryAcquireExcludesAndTokensIncrease(t *testing.T, be Backend) {
	a, b := be.NewDriver(t), be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	ga, err := a.TryAcquire(ctx, Req("t1", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if ga.Count != 1 || ga.Token == 0 || ga.TTL < be.TTL || ga.TTL > be.TTL+time.Second || ga.Lost == nil {
		t.Fatalf("grant = %+v", ga)
	}
	_, err = b.TryAcquire(ctx, Req("t1", "B"))
	var le *driver.LockedError
	if !errors.As(err, &le) || !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("second TryAcquire: %v, want LockedError", err)
	}
	if q := be.Queue(t, "t1"); len(q) != 1 {
		t.Fatalf("queue after failed TryAcquire: %q, want only the holder's entry", q)
	}
	if n, err := a.Release(ctx, Lease("t1", "A", ga)); err != nil || n != 0 {
		t.Fatalf("Release = %d, %v", n, err)
	}
	gb, err := b.TryAcquire(ctx, Req("t1", "B"))
	if err != nil {
		t.Fatal(err)
	}
	if gb.Token <= ga.Token {
		t.Fatalf("token %d after %d: not increasing", gb.Token, ga.Token)
	}
	// A stale release of A's grant must not touch B's entry (etcd #22082).
	if _, err := a.Release(ctx, Lease("t1", "A", ga)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("stale Release: %v, want ErrNotHeld", err)
	}
	if errs, err := b.Renew(ctx, []driver.Lease{Lease("t1", "B", gb)}); err != nil || errs[0] != nil {
		t.Fatalf("B's grant after a stale release: %v %v", errs, err)
	}
}

// ReentranceAndOwners: another owner on the same driver is refused; the
// same owner re-enters with the same token, and only the last release
// deletes the entry.
func ReentranceAndOwners(t *testing.T, be Backend) {
	d := be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	g1, err := d.TryAcquire(ctx, Req("t2", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.TryAcquire(ctx, Req("t2", "B")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("other owner on the same driver: %v, want ErrLocked", err)
	}
	g2, err := d.Acquire(ctx, Req("t2", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if g2.Count != 2 || g2.Token != g1.Token {
		t.Fatalf("re-entry grant %+v after %+v", g2, g1)
	}
	if n, err := d.Release(ctx, Lease("t2", "A", g2)); err != nil || n != 1 {
		t.Fatalf("first Release = %d, %v; want 1", n, err)
	}
	if len(be.Queue(t, "t2")) != 1 {
		t.Fatal("entry gone while a hold remains")
	}
	if n, err := d.Release(ctx, Lease("t2", "A", g1)); err != nil || n != 0 {
		t.Fatalf("second Release = %d, %v; want 0", n, err)
	}
	if q := be.Queue(t, "t2"); len(q) != 0 {
		t.Fatalf("entries left: %q", q)
	}
}

// AcquireQueuesInOrder: waiters get the lock in arrival order, with
// increasing tokens, and none while the holder holds.
func AcquireQueuesInOrder(t *testing.T, be Backend) {
	a := be.NewDriver(t)
	ctx := Ctx(t, 20*time.Second)
	ga, err := a.TryAcquire(ctx, Req("t3", "A"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		who string
		g   driver.Grant
		err error
	}
	got := make(chan result, 2)
	for i, who := range []string{"B", "C"} {
		d := be.NewDriver(t)
		go func() {
			g, err := d.Acquire(ctx, Req("t3", who))
			got <- result{who, g, err}
			if err == nil {
				d.Release(context.Background(), Lease("t3", who, g))
			}
		}()
		// Wait until this waiter is queued, so the order is B, C.
		Eventually(t, 5*time.Second, who+" queued", func() bool { return len(be.Queue(t, "t3")) == i+2 })
	}
	select {
	case r := <-got:
		t.Fatalf("%s acquired while A holds: %v", r.who, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := a.Release(ctx, Lease("t3", "A", ga)); err != nil {
		t.Fatal(err)
	}
	prev := ga.Token
	for _, want := range []string{"B", "C"} {
		r := <-got
		if r.err != nil || r.who != want {
			t.Fatalf("got %s (%v), want %s", r.who, r.err, want)
		}
		if r.g.Token <= prev {
			t.Fatalf("token %d not above %d", r.g.Token, prev)
		}
		prev = r.g.Token
	}
}

// CancelledAcquireLeavesNothing: a waiter cancelled in the queue, or before
// it starts, leaves no entry behind.
func CancelledAcquireLeavesNothing(t *testing.T, be Backend) {
	a, b := be.NewDriver(t), be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	ga, err := a.TryAcquire(ctx, Req("t4", "A"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(wctx, Req("t4", "B"))
		done <- err
	}()
	Eventually(t, 5*time.Second, "B queued", func() bool { return len(be.Queue(t, "t4")) == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, want context.Canceled", err)
	}
	if be.CleanupAtOnce {
		if q := be.Queue(t, "t4"); len(q) != 1 {
			t.Fatalf("queue after cancel: %q, want only A's entry", q)
		}
	}
	Eventually(t, 5*time.Second, "B's entry deleted", func() bool { return len(be.Queue(t, "t4")) == 1 })
	// Cancelled before it even starts: nothing is created, or it is deleted.
	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if _, err := b.Acquire(cctx, Req("t4", "B")); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v", err)
	}
	Eventually(t, 5*time.Second, "no entry of B", func() bool { return len(be.Queue(t, "t4")) == 1 })
	a.Release(ctx, Lease("t4", "A", ga))
}

// RenewFindsDeletedEntry: Renew reports ErrNotHeld for a grant whose entry
// was deleted behind the driver's back, and nothing for the others.
func RenewFindsDeletedEntry(t *testing.T, be Backend) {
	d := be.NewDriver(t)
	ctx := Ctx(t, 10*time.Second)
	g1, err := d.TryAcquire(ctx, Req("t5a", "A"))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := d.TryAcquire(ctx, Req("t5b", "A"))
	if err != nil {
		t.Fatal(err)
	}
	be.Drop(t, "t5a")
	errs, err := d.Renew(ctx, []driver.Lease{Lease("t5a", "A", g1), Lease("t5b", "A", g2)})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[0], driver.ErrNotHeld) || errs[1] != nil {
		t.Fatalf("Renew errs = %v, want [ErrNotHeld nil]", errs)
	}
}

// BehindForeign checks, while a foreign client (the backend's own lock
// recipe) holds name, that d's TryAcquire is refused and its Acquire queues
// and waits, then lets the foreign holder go with release and returns the
// grant d gets after it.
func BehindForeign(t *testing.T, ctx context.Context, be Backend, d Driver, name, foreign string, release func()) driver.Grant {
	t.Helper()
	if _, err := d.TryAcquire(ctx, Req(name, "A")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("dlock TryAcquire while %s holds: %v, want ErrLocked", foreign, err)
	}
	var acquired atomic.Bool
	got := make(chan driver.Grant, 1)
	go func() {
		g, err := d.Acquire(ctx, Req(name, "A"))
		if err != nil {
			t.Error(err)
		}
		acquired.Store(true)
		got <- g
	}()
	Eventually(t, 5*time.Second, "dlock queued behind "+foreign, func() bool { return len(be.Queue(t, name)) == 2 })
	if acquired.Load() {
		t.Fatalf("dlock acquired while %s holds", foreign)
	}
	release()
	return <-got
}

// Inspect: Inspect lists the locks under a prefix sorted by name, with the
// holder's hold count (2 on "insp/x", re-entered) and waiters (1 on
// "insp/x"), and nothing for a prefix no name has. extra are more names
// under "insp/", each acquired once, that sort around "insp/x" and test the
// backend's name escaping.
func Inspect(t *testing.T, be Backend, extra ...string) {
	a, b := be.NewDriver(t), be.NewDriver(t)
	ins, ok := a.(driver.Inspector)
	if !ok {
		t.Fatalf("%T is not a driver.Inspector", a)
	}
	ctx := Ctx(t, 10*time.Second)
	ga, err := a.TryAcquire(ctx, Req("insp/x", "A"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, Req("insp/x", "A")); err != nil {
		t.Fatal(err)
	}
	want := []driver.LockInfo{{Name: "insp/x", Owner: "A", Token: ga.Token, Count: 2, ExpiresIn: -1, Waiters: 1}}
	for _, name := range extra {
		if _, err := a.TryAcquire(ctx, Req(name, "A")); err != nil {
			t.Fatal(err)
		}
		want = append(want, driver.LockInfo{Name: name, Owner: "A", Count: 1, ExpiresIn: -1, Waiters: 0})
	}
	sort.Slice(want, func(i, j int) bool { return want[i].Name < want[j].Name })
	go b.Acquire(ctx, Req("insp/x", "B"))
	Eventually(t, 5*time.Second, "B queued", func() bool { return len(be.Queue(t, "insp/x")) == 2 })
	infos, err := ins.Inspect(ctx, "insp/")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != len(want) {
		t.Fatalf("Inspect = %+v", infos)
	}
	for i := range want {
		if want[i].Token == 0 {
			infos[i].Token = 0 // the token of an extra name is not known here
		}
		if infos[i] != want[i] {
			t.Errorf("Inspect[%d] = %+v, want %+v", i, infos[i], want[i])
		}
	}
	if infos, err := b.(driver.Inspector).Inspect(ctx, "insp/xx"); err != nil || len(infos) != 0 {
		t.Fatalf("Inspect(insp/xx) = %+v, %v", infos, err)
	}
}
