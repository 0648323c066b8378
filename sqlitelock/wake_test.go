package sqlitelock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
	"github.com/dlock/dlock/internal/testwait"
)

// BenchmarkWakeFair reports wake-up latency, the re-take share under 8
// contenders and the longest wait with 9 (see sqltest.WakeFair), each driver
// opening the file anew as another process would. Run with -benchtime=50x
// or so: each run takes some 6s whatever b.N.
func BenchmarkWakeFair(b *testing.B) {
	hn, err := newHarness(context.Background(), b)
	if err != nil {
		b.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	sqltest.WakeFair(b, h.NewDriver)
}

// TestWakesOnRelease: a release wakes a waiter in another driver (another
// process, as far as the file is concerned) through the companion file,
// long before its next poll.
func TestWakesOnRelease(t *testing.T) {
	hn, err := newHarness(context.Background(), t)
	if err != nil {
		t.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	sqltest.WakesOnRelease(t, h.NewDriver)
}

// TestReleaserStandsBack: a driver that releases a lock another driver's
// subscriber waits for holds its own next attempt back for a moment (the
// woken waiter takes the lock, and the attempt is then refused), and takes
// the lock at once when nobody waits. Before, the releaser looping back
// into Lock took the lock again about 83% of the time under 8 contenders.
func TestReleaserStandsBack(t *testing.T) {
	ctx := context.Background()
	a, b := twoDrivers(t)
	var standing atomic.Int64
	// An attempt that stands back waits on hold, when set, so the test
	// can act within its stand-back however slow the machine.
	var hold atomic.Pointer[chan struct{}]
	a.(*Driver).testHookStandBack = func() {
		standing.Add(1)
		if c := hold.Load(); c != nil {
			<-*c
		}
	}
	req := func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: "hot", Owner: owner, TTL: time.Minute}
	}
	// Nobody waits: release and take again at once.
	g, err := a.TryAcquire(ctx, req("a1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, driver.Lease{Name: "hot", Owner: "a1", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	if g, err = a.TryAcquire(ctx, req("a2")); err != nil || standing.Load() != 0 {
		t.Fatalf("uncontended re-take: %v, %d stand-backs", err, standing.Load())
	}
	// b waits: a's next attempt after its release stands back, b takes it.
	sub, err := b.(driver.Notifier).Subscribe(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Release(ctx, driver.Lease{Name: "hot", Owner: "a2", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	hold.Store(&held)
	a3 := make(chan error, 1)
	go func() {
		_, err := a.TryAcquire(ctx, req("a3"))
		a3 <- err
	}()
	testwait.Until(t, 10*time.Second, "the releaser's own attempt with a waiter elsewhere to stand back", func() bool { return standing.Load() == 1 })
	gb, err := b.TryAcquire(ctx, req("b"))
	if err != nil {
		t.Fatalf("the waiter's attempt: %v", err)
	}
	hold.Store(nil)
	close(held)
	if err := <-a3; !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the releaser's attempt after its stand-back: %v, want ErrLocked (the waiter holds the lock)", err)
	}
	_ = sub.Close()
	// With b's subscription closed nobody waits any more: a, still within
	// its stand-back, is answered by the table at once.
	if _, err := b.Release(ctx, driver.Lease{Name: "hot", Owner: "b", Token: gb.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, req("a4")); err != nil || standing.Load() != 1 {
		t.Fatalf("the releaser's attempt after the waiter left: %v, %d stand-backs (want 1)", err, standing.Load())
	}
}

// TestStandBackThenAsksTable: an attempt that stands back is delayed, not
// refused: when the woken waiter does not come for the lock within the
// stand-back, the releaser's attempt then asks the table and is granted.
// (It used to be refused as if the lock were held, and the refused Lock
// waited out the rest of the stand-back and a millisecond more before it
// asked again.)
func TestStandBackThenAsksTable(t *testing.T) {
	ctx := context.Background()
	a, b := twoDrivers(t)
	var standing atomic.Int64
	a.(*Driver).testHookStandBack = func() { standing.Add(1) }
	req := func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: "idle-waiter", Owner: owner, TTL: time.Minute}
	}
	g := heldWhileWatched(t, a, b, req("a1"))
	if _, err := a.Release(ctx, driver.Lease{Name: "idle-waiter", Owner: "a1", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, req("a2")); err != nil || standing.Load() != 1 {
		t.Fatalf("the releaser's attempt with a waiter that does not come: %v after %d stand-backs, want a grant after 1", err, standing.Load())
	}
}

// heldWhileWatched takes req on a and has b wait for the name (subscribed
// until the test ends): a's release of the grant it returns wakes b.
func heldWhileWatched(t *testing.T, a, b driver.Driver, req driver.AcquireRequest) driver.Grant {
	t.Helper()
	ctx := context.Background()
	g, err := a.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := b.(driver.Notifier).Subscribe(ctx, req.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return g
}

// twoDrivers opens two drivers on one new database, closed with the test.
func twoDrivers(t *testing.T) (driver.Driver, driver.Driver) {
	t.Helper()
	ctx := context.Background()
	hn, err := newHarness(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	h := hn.(*harness)
	t.Cleanup(h.Close)
	var ds [2]driver.Driver
	for i := range ds {
		if ds[i], err = h.NewDriver(ctx); err != nil {
			t.Fatal(err)
		}
		d := ds[i]
		t.Cleanup(func() { _ = d.Close() })
	}
	return ds[0], ds[1]
}

// TestStandBackSparesRefusedWaiter: a waiting Lock that the table refused
// before the release (Waiting, the same owner) is not held back by its
// driver's stand-back: it may be the very waiter the release woke
// (TestReleaserStandsBack shows a new attempt of that driver held back).
func TestStandBackSparesRefusedWaiter(t *testing.T) {
	ctx := context.Background()
	a, b := twoDrivers(t)
	req := func(owner string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: "spare", Owner: owner, TTL: time.Minute, Waiting: true}
	}
	g := heldWhileWatched(t, a, b, req("holder"))
	if _, err := a.TryAcquire(ctx, req("waiter")); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("the waiter's first attempt: %v, want ErrLocked", err)
	}
	if _, err := a.Release(ctx, driver.Lease{Name: "spare", Owner: "holder", Token: g.Token}); err != nil {
		t.Fatal(err)
	}
	var standing atomic.Int64
	a.(*Driver).testHookStandBack = func() { standing.Add(1) }
	if _, err := a.TryAcquire(ctx, req("waiter")); err != nil || standing.Load() != 0 {
		t.Fatalf("the refused waiter's retry during the stand-back: %v, %d stand-backs; want a grant at once", err, standing.Load())
	}
}

// TestCompanionLayout: a name's byte is the 64-bit FNV-1a hash of the name
// with its top two bits cleared, its waiters' byte that plus 2^62, both in
// the shard file named by the hash modulo 64 (docs/protocol.md; other
// processes, maybe of other builds, must agree).
func TestCompanionLayout(t *testing.T) {
	for _, name := range []string{"", "a", "orders/42", "ünï"} {
		h := fnv.New64a()
		h.Write([]byte(name))
		want := h.Sum64()
		off := offset(name)
		if off != int64(want&(1<<62-1)) {
			t.Errorf("offset(%q) = %#x, want %#x", name, off, want&(1<<62-1))
		}
		if s := shardOf(off); s != int(want%64) || shardOf(waitersOff(off)) != s {
			t.Errorf("%q: shard %d (waiters %d), want %d", name, s, shardOf(waitersOff(off)), want%64)
		}
	}
	s := &signal{dir: "/x/locks.db-dlock.d"}
	if p := s.path(offset("a")); p != fmt.Sprintf("/x/locks.db-dlock.d/%d", shardOf(offset("a"))) {
		t.Errorf("path = %q", p)
	}
}

// TestBusyWaiterMarksName: a waiting Lock's attempt that finds the file
// busy (another process's write lock) marks its name while it retries, as
// a subscriber does, so that the holder's driver sees a waiter and stands
// back once it releases; the mark goes with the attempt. Without it, such a
// waiter was invisible until the table refused it, and a driver committing
// back to back (a hot lock: release, acquire, release ...) kept the file
// busy nearly all the time: in the peer harness, 8 drivers on one file, the
// releaser took the lock again 69–98% of the time.
func TestBusyWaiterMarksName(t *testing.T) {
	path := tempDB(t)
	a := openTest(t, path, &Options{BusyTimeout: time.Minute})
	b := openTest(t, path, &Options{BusyTimeout: time.Minute})
	mustAcquire(t, a, req("busy", "alice", time.Minute, 0))
	if watchedElsewhere(a, "busy") {
		t.Fatal("watched before anybody waits")
	}
	_, letGo := holdFile(t, path)
	// A TryLock (not Waiting) that finds the file busy is no waiter.
	tried := testwait.Go(func() (driver.Grant, error) {
		return b.TryAcquire(context.Background(), req("busy", "carol", time.Minute, 0))
	})
	r := req("busy", "bob", time.Minute, 0)
	r.Waiting = true
	waited := testwait.Go(func() (driver.Grant, error) { return b.TryAcquire(context.Background(), r) })
	testwait.Until(t, 10*time.Second, "the holder's driver to see the busy waiter", func() bool { return watchedElsewhere(a, "busy") })
	letGo()
	for _, o := range []<-chan testwait.Outcome[driver.Grant]{tried, waited} {
		if out := <-o; !errors.Is(out.Err, driver.ErrLocked) {
			t.Fatalf("attempt once the file is free: %v, want ErrLocked", out.Err)
		}
	}
	if watchedElsewhere(a, "busy") {
		t.Fatal("still watched after the waiting attempt returned")
	}
}

// watchedElsewhere reports whether a driver other than d marks name as
// watched (see signal.marked), as d sees it when it releases name.
func watchedElsewhere(d *Driver, name string) bool {
	d.sig.mu.Lock()
	defer d.sig.mu.Unlock()
	off := waitersOff(offset(name))
	f := d.sig.files[shardOf(off)].f
	if f == nil {
		return false
	}
	w, err := f.others(off)
	return err == nil && w
}

// TestOpenBusyStep: a driver Open made lets SQLite sleep at most busyStep
// for the write lock before retryBusy tries again (SQLite's own busy
// handler, given the whole busy timeout, sleeps up to 100 ms between tries
// and lets a process committing back to back starve the others).
func TestOpenBusyStep(t *testing.T) {
	d := openTest(t, tempDB(t), &Options{BusyTimeout: time.Minute})
	var ms int64
	if err := d.db.QueryRow(`PRAGMA busy_timeout`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	if ms != busyStep.Milliseconds() {
		t.Fatalf("busy_timeout = %d ms, want %d", ms, busyStep.Milliseconds())
	}
}
