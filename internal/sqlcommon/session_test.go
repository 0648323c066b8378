package sqlcommon

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// fakeConn records what the bookkeeping did to a pinned connection. The
// drivers' own tests run Sessions against real servers; this one checks the
// bookkeeping alone, including paths a server rarely takes.
type fakeConn struct {
	mu                          sync.Mutex
	released, discarded, closed bool
	abandoned                   bool
	pings                       int
	lastTTL                     time.Duration
}

func (c *fakeConn) Release() { c.mu.Lock(); c.released = true; c.mu.Unlock() }
func (c *fakeConn) Discard() { c.mu.Lock(); c.discarded = true; c.mu.Unlock() }
func (c *fakeConn) Abandon() func() {
	c.mu.Lock()
	c.abandoned = true
	c.mu.Unlock()
	return func() { c.mu.Lock(); c.closed = true; c.mu.Unlock() }
}

func acquire(t *testing.T, s *Sessions[*fakeConn], name, owner string, token uint64) (*fakeConn, driver.Grant) {
	t.Helper()
	c := &fakeConn{}
	g, err := s.Acquire(context.Background(), driver.AcquireRequest{Name: name, Owner: owner, TTL: time.Second}, "test",
		func(context.Context) (*fakeConn, error) { return c, nil },
		func(context.Context, *fakeConn) (bool, uint64, error) { return true, token, nil },
		func(*fakeConn) { t.Error("abort called on a granted lock") })
	if err != nil {
		t.Fatal(err)
	}
	return c, g
}

func lease(name, owner string, g driver.Grant) driver.Lease {
	return driver.Lease{Name: name, Owner: owner, Token: g.Token, Handle: g.Handle, TTL: g.TTL}
}

func TestSessionsReentryAndRelease(t *testing.T) {
	ctx := context.Background()
	s := NewSessions[*fakeConn]("test")
	c, g := acquire(t, s, "n", "o", 7)
	// Re-entry never reaches pin; another owner sees the held token.
	noPin := func(context.Context) (*fakeConn, error) { t.Fatal("pinned for a held name"); return nil, nil }
	g2, err := s.Acquire(ctx, driver.AcquireRequest{Name: "n", Owner: "o", TTL: time.Second}, "test", noPin, nil, nil)
	if err != nil || g2.Count != 2 || g2.Token != 7 {
		t.Fatalf("re-entry = %+v, %v", g2, err)
	}
	var le *driver.LockedError
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Name: "n", Owner: "x"}, "test", noPin, nil, nil); !errors.As(err, &le) || le.Token != 7 {
		t.Fatalf("other owner: %v", err)
	}
	unlocks := 0
	unlock := func(context.Context, *fakeConn) error { unlocks++; return nil }
	if n, err := s.Release(ctx, lease("n", "o", g), unlock); n != 1 || err != nil || unlocks != 0 {
		t.Fatalf("first release = %d, %v (unlocks %d)", n, err, unlocks)
	}
	if n, err := s.Release(ctx, lease("n", "o", g), unlock); n != 0 || err != nil || unlocks != 1 || !c.released {
		t.Fatalf("last release = %d, %v (unlocks %d, released %v)", n, err, unlocks, c.released)
	}
	if _, err := s.Release(ctx, lease("n", "o", g), unlock); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release after the last: %v", err)
	}
	if s.Len() != 0 {
		t.Fatalf("%d holds listed after release", s.Len())
	}
	if _, err := s.Release(ctx, driver.Lease{Name: "n", Owner: "o", Token: 7}, unlock); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release of a lease without its handle: %v", err)
	}
}

func TestSessionsFailures(t *testing.T) {
	ctx := context.Background()
	s := NewSessions[*fakeConn]("test")
	// A failed unlock closes the connection and reports loss.
	c, g := acquire(t, s, "a", "o", 1)
	_, err := s.Release(ctx, lease("a", "o", g), func(context.Context, *fakeConn) error { return errors.New("boom") })
	if !errors.Is(err, driver.ErrSessionLost) || !c.discarded || c.released {
		t.Fatalf("failed unlock: %v (discarded %v, released %v)", err, c.discarded, c.released)
	}
	select {
	case <-g.Lost:
	default:
		t.Fatal("Lost still open after a failed unlock")
	}
	// Renew pings each hold once, with the longest TTL, and a failed ping
	// ends the hold.
	cb, gb := acquire(t, s, "b", "o", 2)
	cc, gc := acquire(t, s, "c", "o", 3)
	lb := lease("b", "o", gb)
	lb2 := lb
	lb2.TTL = 5 * time.Second
	ping := func(_ context.Context, c *fakeConn, ttl time.Duration) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pings++
		c.lastTTL = ttl
		if c == cc {
			return errors.New("gone")
		}
		return nil
	}
	errs := s.Renew(ctx, []driver.Lease{lb, lease("c", "o", gc), lb2, lease("a", "o", g)}, ping)
	if errs[0] != nil || errs[2] != nil || cb.pings != 1 || cb.lastTTL != 5*time.Second {
		t.Fatalf("renew of b: %v %v, pings %d, ttl %v", errs[0], errs[2], cb.pings, cb.lastTTL)
	}
	if !errors.Is(errs[1], driver.ErrSessionLost) || !cc.discarded || s.Get("c") != nil {
		t.Fatalf("renew of c: %v (discarded %v)", errs[1], cc.discarded)
	}
	if !errors.Is(errs[3], driver.ErrSessionLost) {
		t.Fatalf("renew of the lost a: %v", errs[3])
	}
	// A lock refused by the server goes back to the pool; a failed lock is
	// aborted.
	refused := &fakeConn{}
	_, err = s.Acquire(ctx, driver.AcquireRequest{Name: "d", Owner: "o"}, "test",
		func(context.Context) (*fakeConn, error) { return refused, nil },
		func(context.Context, *fakeConn) (bool, uint64, error) { return false, 0, nil }, nil)
	var le *driver.LockedError
	if !errors.As(err, &le) || !refused.released {
		t.Fatalf("refused: %v (released %v)", err, refused.released)
	}
	aborted := false
	_, err = s.Acquire(ctx, driver.AcquireRequest{Name: "d", Owner: "o"}, "test",
		func(context.Context) (*fakeConn, error) { return &fakeConn{}, nil },
		func(context.Context, *fakeConn) (bool, uint64, error) { return false, 0, errors.New("broken") },
		func(*fakeConn) { aborted = true })
	if err == nil || !aborted || s.Get("d") != nil {
		t.Fatalf("failed lock: %v (aborted %v)", err, aborted)
	}
	if _, err := s.Acquire(ctx, driver.AcquireRequest{Name: "d", Owner: "o", LockDelay: time.Second}, "test", nil, nil, nil); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("lock-delay: %v", err)
	}
}

func TestSessionsCloseAndKill(t *testing.T) {
	s := NewSessions[*fakeConn]("test")
	c, g := acquire(t, s, "a", "o", 1)
	holds, first := s.Close()
	if !first || len(holds) != 1 {
		t.Fatalf("Close = %d holds, first %v", len(holds), first)
	}
	s.EndAll(holds)
	if !c.discarded || g.Cause() == nil {
		t.Fatalf("after Close: discarded %v, cause %v", c.discarded, g.Cause())
	}
	if _, first := s.Close(); first {
		t.Fatal("second Close reported first")
	}
	if err := s.Check(); err == nil {
		t.Fatal("Check after Close = nil")
	}
	if _, err := s.Acquire(context.Background(), driver.AcquireRequest{Name: "b", Owner: "o"}, "test",
		func(context.Context) (*fakeConn, error) { return &fakeConn{}, nil },
		func(context.Context, *fakeConn) (bool, uint64, error) { return true, 2, nil }, nil); err == nil {
		t.Fatal("Acquire after Close succeeded")
	}

	k := NewSessions[*fakeConn]("test")
	kc, _ := acquire(t, k, "a", "o", 1)
	k.Kill()
	if !kc.abandoned || kc.discarded || kc.closed {
		t.Fatalf("after Kill: abandoned %v, discarded %v, closed %v", kc.abandoned, kc.discarded, kc.closed)
	}
	if err := k.Check(); !errors.Is(err, ErrKilled) {
		t.Fatalf("Check after Kill = %v", err)
	}
	if _, first := k.Close(); first || !kc.closed {
		t.Fatalf("Close after Kill: first %v, socket closed %v", first, kc.closed)
	}
}
