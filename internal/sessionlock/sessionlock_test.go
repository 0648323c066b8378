package sessionlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type handle struct{ id int }

// backend is an in-memory stand-in for a driver's round trips.
type backend struct {
	next    int
	held    map[*handle]bool
	enqueue func() error // when not nil, runs before a fresh grant
	reenter error
	adopt   *handle // when not nil, Enqueue finds this grant already in place
}

func (b *backend) ops(ctx context.Context) Ops[*handle] {
	return Ops[*handle]{
		Enqueue: func() (driver.Grant, error) {
			if b.enqueue != nil {
				if err := b.enqueue(); err != nil {
					return driver.Grant{}, err
				}
			}
			if b.adopt != nil { // the backend finds this owner's grant in place
				return driver.Grant{Handle: &handle{b.adopt.id}, Token: uint64(b.adopt.id), Count: 1}, nil
			}
			b.next++
			h := &handle{b.next}
			b.held[h] = true
			return driver.Grant{Handle: h, Token: uint64(h.id), Count: 1}, nil
		},
		Check:   b.check,
		Reenter: func(*handle) error { return b.reenter },
		Grant: func(h *handle, n int, sent time.Time) driver.Grant {
			return driver.Grant{Handle: h, Token: uint64(h.id), Count: n, Sent: sent}
		},
	}
}

func (b *backend) check(h *handle) (bool, time.Time, error) { return b.held[h], time.Now(), nil }

func newBackend() *backend { return &backend{held: map[*handle]bool{}} }

func TestReentrance(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	g1, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	if err != nil || g1.Count != 1 {
		t.Fatalf("first acquire: %+v, %v", g1, err)
	}
	g2, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	if err != nil || g2.Count != 2 || g2.Handle != g1.Handle {
		t.Fatalf("re-entrant acquire: %+v, %v; want count 2 on the same handle", g2, err)
	}
	if other, err := hs.Acquire(ctx, "n", "p", false, "test", b.ops(ctx)); err != nil || other.Handle == g1.Handle {
		t.Fatalf("another owner shares the hold: %+v, %v", other, err)
	}
	if c := hs.Count("n", "o", func(*handle) bool { return true }); c != 2 {
		t.Fatalf("Count = %d, want 2", c)
	}
	h := g1.Handle.(*handle)
	gone := func() error { return driver.ErrNotHeld }
	if n, nested, err := hs.Release("n", "o", h, b.check, gone); n != 1 || !nested || err != nil {
		t.Fatalf("nested release: %d, %v, %v", n, nested, err)
	}
	if n, nested, err := hs.Release("n", "o", h, b.check, gone); n != 0 || nested || err != nil {
		t.Fatalf("last release: %d, %v, %v", n, nested, err)
	}
	if c := hs.Count("n", "o", func(*handle) bool { return true }); c != 1 {
		t.Fatalf("Count after release = %d, want 1", c)
	}
}

func TestLostHoldStartsAfresh(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	g1, _ := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	b.held[g1.Handle.(*handle)] = false
	g2, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	if err != nil || g2.Count != 1 || g2.Handle == g1.Handle {
		t.Fatalf("acquire after loss: %+v, %v; want a fresh grant", g2, err)
	}
}

// A check that wrongly reports a grant gone does not reset the hold count
// when the fresh enqueue finds the same grant (same token) in place.
func TestFalseLossKeepsTheHold(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	g1, _ := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	h1 := g1.Handle.(*handle)
	b.held[h1] = false // the check errs ...
	b.adopt = h1       // ... but the grant is still there
	g2, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	if err != nil || g2.Count != 2 || g2.Handle != g1.Handle || g2.Token != g1.Token {
		t.Fatalf("re-entry after a false loss: %+v, %v; want count 2 on the same handle", g2, err)
	}
}

func TestNestedReleaseOfLostGrant(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	g, _ := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	h := g.Handle.(*handle)
	b.held[h] = false
	_, nested, err := hs.Release("n", "o", h, b.check, func() error { return driver.ErrNotHeld })
	if !nested || !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release of a lost nested grant: %v, %v", nested, err)
	}
	if hs.Busy(func(*handle) bool { return true }) {
		t.Fatal("the lost hold was not forgotten")
	}
}

func TestReenterErrorUndoesCount(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	b.reenter = errors.New("guard failed")
	if _, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx)); err == nil {
		t.Fatal("re-entrant acquire succeeded although Reenter failed")
	}
	if c := hs.Count("n", "o", func(*handle) bool { return true }); c != 1 {
		t.Fatalf("Count = %d after a failed re-entrance, want 1", c)
	}
}

func TestPendingAcquire(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	entered, release := make(chan struct{}), make(chan struct{})
	b.enqueue = func() error { close(entered); <-release; return nil }
	first := make(chan driver.Grant, 1)
	go func() {
		g, _ := hs.Acquire(ctx, "n", "o", true, "test", b.ops(ctx))
		first <- g
	}()
	<-entered
	if !hs.Busy(func(*handle) bool { return false }) {
		t.Fatal("Busy is false while an acquire is in flight")
	}
	var locked *driver.LockedError
	if _, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx)); !errors.As(err, &locked) {
		t.Fatalf("non-waiting acquire during a pending one: %v, want *driver.LockedError", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := hs.Acquire(cctx, "n", "o", true, "test", b.ops(cctx)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait on a pending acquire: %v", err)
	}
	second := make(chan driver.Grant, 1)
	go func() {
		g, _ := hs.Acquire(ctx, "n", "o", true, "test", b.ops(ctx))
		second <- g
	}()
	close(release)
	g1 := <-first
	g2 := <-second
	if g2.Count != 2 || g2.Handle != g1.Handle {
		t.Fatalf("waiting acquire got %+v, want a re-entrant grant on %v", g2, g1.Handle)
	}
}

func TestSession(t *testing.T) {
	t0 := time.Now()
	s := NewSession(t0)
	s.Refresh(t0.Add(-time.Second))
	if !s.RefreshedAt().Equal(t0) {
		t.Fatal("Refresh moved the refresh time back")
	}
	s.Refresh(t0.Add(time.Second))
	if !s.RefreshedAt().Equal(t0.Add(time.Second)) {
		t.Fatal("Refresh did not record a later send time")
	}
	if s.Lost() || s.Cause() != nil {
		t.Fatal("a new session is lost")
	}
	s.End(driver.ErrSessionLost)
	<-s.Done()
	if !s.Lost() || !errors.Is(s.Cause(), driver.ErrSessionLost) {
		t.Fatalf("ended session: lost %v, cause %v", s.Lost(), s.Cause())
	}
	// A second End (a watcher racing the driver's Close) keeps the first
	// cause and does not panic.
	s.End(errors.New("later"))
	if !errors.Is(s.Cause(), driver.ErrSessionLost) {
		t.Fatalf("a second End replaced the cause: %v", s.Cause())
	}
}

func TestGroup(t *testing.T) {
	g := NewGroup()
	started := make(chan struct{})
	if !g.Go(func() { close(started); <-g.Context().Done() }) {
		t.Fatal("Go refused on a running group")
	}
	<-started
	g.Stop()
	if g.Go(func() {}) {
		t.Fatal("Go accepted after Stop")
	}
}

// TestNestedReleaseRetriedAfterFailedCheck: a nested release whose check
// fails (its outcome unknown to the caller) changes nothing, so the caller's
// retry counts the hold down once, not twice.
func TestNestedReleaseRetriedAfterFailedCheck(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	var g driver.Grant
	for range 3 {
		var err error
		if g, err = hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx)); err != nil {
			t.Fatal(err)
		}
	}
	h := g.Handle.(*handle)
	gone := func() error { return driver.ErrNotHeld }
	failing := func(*handle) (bool, time.Time, error) { return false, time.Time{}, errors.New("connection closed") }
	if _, nested, err := hs.Release("n", "o", h, failing, gone); !nested || err == nil {
		t.Fatalf("release with a failing check: nested %v, err %v; want nested and an error", nested, err)
	}
	if c := hs.Count("n", "o", func(*handle) bool { return true }); c != 3 {
		t.Fatalf("Count after a failed release = %d, want 3 (nothing changed)", c)
	}
	if n, nested, err := hs.Release("n", "o", h, b.check, gone); n != 2 || !nested || err != nil {
		t.Fatalf("retried release: %d, %v, %v; want 2 holds left", n, nested, err)
	}
}

// After a check that wrongly reports the grant gone, Again (not Enqueue) is
// given the old handle; when it finds that grant in place, the hold keeps
// its handle and count and is re-entered, Reenter included, and a Reenter
// error leaves the hold as it was.
func TestAgainFindsTheOldGrant(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	g1, _ := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx))
	h1 := g1.Handle.(*handle)
	var prevs []*handle
	reentered := 0
	ops := b.ops(ctx)
	ops.Again = func(prev *handle) (driver.Grant, error) {
		prevs = append(prevs, prev)
		return ops.Grant(prev, 1, time.Now()), nil
	}
	ops.Reenter = func(*handle) error { reentered++; return b.reenter }
	b.held[h1] = false // every check errs; the grant is still there
	g2, err := hs.Acquire(ctx, "n", "o", false, "test", ops)
	if err != nil || g2.Count != 2 || g2.Handle != g1.Handle || g2.Token != g1.Token {
		t.Fatalf("re-entry after a false loss: %+v, %v; want count 2 on the same handle", g2, err)
	}
	if len(prevs) != 1 || prevs[0] != h1 || reentered != 1 {
		t.Fatalf("Again got %v, Reenter ran %d times; want Again(h1) once and Reenter once", prevs, reentered)
	}
	b.reenter = errors.New("guard failed")
	if _, err := hs.Acquire(ctx, "n", "o", false, "test", ops); err == nil {
		t.Fatal("re-entry succeeded although Reenter failed")
	}
	if c := hs.Count("n", "o", func(h *handle) bool { return h == h1 }); c != 2 {
		t.Fatalf("Count = %d after a failed re-entry through Again, want 2 (the hold kept)", c)
	}
}

// TestBeginEnd: an acquire begun outside Acquire holds back a concurrent
// Acquire of the same (name, owner) until it ends; a granted one is then
// re-entered, a failed one taken afresh; Begin refuses a held or pending
// (name, owner).
func TestBeginEnd(t *testing.T) {
	ctx := context.Background()
	b := newBackend()
	var hs Holds[*handle]
	if !hs.Begin("n", "o") {
		t.Fatal("Begin of a free (name, owner) refused")
	}
	if hs.Begin("n", "o") {
		t.Fatal("Begin while another acquire is in flight")
	}
	if _, err := hs.Acquire(ctx, "n", "o", false, "test", b.ops(ctx)); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquire while Begin is in flight: %v, want ErrLocked", err)
	}
	done := make(chan driver.Grant, 1)
	go func() {
		g, err := hs.Acquire(ctx, "n", "o", true, "test", b.ops(ctx))
		if err != nil {
			t.Error(err)
		}
		done <- g
	}()
	h := &handle{100}
	b.held[h] = true
	hs.End("n", "o", h, true)
	select {
	case g := <-done:
		if g.Count != 2 || g.Handle != h {
			t.Fatalf("Acquire after a granted End: %+v, want a re-entry of it", g)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire still waiting after End")
	}
	if hs.Begin("n", "o") {
		t.Fatal("Begin of a held (name, owner)")
	}
	if !hs.Begin("m", "o") {
		t.Fatal("Begin of another name refused")
	}
	hs.End("m", "o", nil, false)
	g, err := hs.Acquire(ctx, "m", "o", false, "test", b.ops(ctx))
	if err != nil || g.Count != 1 {
		t.Fatalf("Acquire after a failed End: %+v, %v", g, err)
	}
}

// TestStamp: a Stamp keeps the latest time recorded, at the same instant,
// and the zero time until one is recorded.
func TestStamp(t *testing.T) {
	var s Stamp
	if !s.Time().IsZero() {
		t.Fatalf("zero Stamp holds %v", s.Time())
	}
	t1 := time.Now()
	t2 := t1.Add(time.Second)
	s.Record(t2)
	s.Record(t1)
	s.Record(time.Time{})
	if got := s.Time(); !got.Equal(t2) || got.Sub(t2) != 0 {
		t.Fatalf("Stamp holds %v, want %v", got, t2)
	}
	t3 := time.Now().Add(2 * time.Second)
	s.Record(t3)
	if got := s.Time(); got.Sub(t3) != 0 {
		t.Fatalf("Stamp holds %v, want %v", got, t3)
	}
}
