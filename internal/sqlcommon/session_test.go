package sqlcommon

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
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
	block                       chan struct{} // if not nil, Discard waits for it to close
}

func (c *fakeConn) Release() { c.mu.Lock(); c.released = true; c.mu.Unlock() }
func (c *fakeConn) Discard() {
	if c.block != nil {
		<-c.block
	}
	c.mu.Lock()
	c.discarded = true
	c.mu.Unlock()
}

// wasDiscarded reads discarded under the lock (a hold's expiry timer may
// discard the connection from its own goroutine).
func (c *fakeConn) wasDiscarded() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.discarded }
func (c *fakeConn) Abandon() func() {
	c.mu.Lock()
	c.abandoned = true
	c.mu.Unlock()
	return func() { c.mu.Lock(); c.closed = true; c.mu.Unlock() }
}

// fakeSQL is a SessionSQL whose steps each test sets before the call that
// runs them; a step left nil fails the test if it runs.
type fakeSQL struct {
	t      *testing.T
	pin    func(context.Context) (*fakeConn, error)
	lock   func(context.Context, *fakeConn) (bool, uint64, error)
	abort  func(*fakeConn)
	unlock func(context.Context, *fakeConn) error
	ping   func(context.Context, *fakeConn, time.Duration) error
}

func (f *fakeSQL) Pin(ctx context.Context, _ driver.AcquireRequest) (*fakeConn, error) {
	if f.pin == nil {
		f.t.Fatal("Pin called")
	}
	return f.pin(ctx)
}

func (f *fakeSQL) Lock(ctx context.Context, c *fakeConn, _ driver.AcquireRequest) (bool, uint64, error) {
	if f.lock == nil {
		f.t.Fatal("Lock called")
	}
	return f.lock(ctx, c)
}

func (f *fakeSQL) Abort(c *fakeConn) {
	if f.abort == nil {
		f.t.Fatal("Abort called")
	}
	f.abort(c)
}

func (f *fakeSQL) Unlock(ctx context.Context, c *fakeConn, _ string) error {
	if f.unlock == nil {
		f.t.Fatal("Unlock called")
	}
	return f.unlock(ctx, c)
}

func (f *fakeSQL) Ping(ctx context.Context, c *fakeConn, ttl time.Duration) error {
	if f.ping == nil {
		f.t.Fatal("Ping called")
	}
	return f.ping(ctx, c, ttl)
}

func newSessions(t *testing.T) (*Sessions[*fakeConn], *fakeSQL) {
	f := &fakeSQL{t: t}
	return NewSessions[*fakeConn]("test", "test", f), f
}

func acquire(t *testing.T, s *Sessions[*fakeConn], name, owner string, token uint64) (*fakeConn, driver.Grant) {
	t.Helper()
	c := &fakeConn{}
	f := s.sql.(*fakeSQL)
	f.pin = func(context.Context) (*fakeConn, error) { return c, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return true, token, nil }
	f.abort = func(*fakeConn) { t.Error("abort called on a granted lock") }
	g, err := s.TryAcquire(context.Background(), driver.AcquireRequest{Name: name, Owner: owner, TTL: time.Second})
	f.pin, f.lock, f.abort = nil, nil, nil
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
	s, f := newSessions(t)
	c, g := acquire(t, s, "n", "o", 7)
	// Re-entry never reaches Pin (nil: the test fails if it runs); another
	// owner sees the held token.
	g2, err := s.TryAcquire(ctx, driver.AcquireRequest{Name: "n", Owner: "o", TTL: time.Second})
	if err != nil || g2.Count != 2 || g2.Token != 7 {
		t.Fatalf("re-entry = %+v, %v", g2, err)
	}
	var le *driver.LockedError
	if _, err := s.TryAcquire(ctx, driver.AcquireRequest{Name: "n", Owner: "x"}); !errors.As(err, &le) || le.Token != 7 {
		t.Fatalf("other owner: %v", err)
	}
	unlocks := 0
	f.unlock = func(context.Context, *fakeConn) error { unlocks++; return nil }
	if n, err := s.Release(ctx, lease("n", "o", g)); n != 1 || err != nil || unlocks != 0 {
		t.Fatalf("first release = %d, %v (unlocks %d)", n, err, unlocks)
	}
	if n, err := s.Release(ctx, lease("n", "o", g)); n != 0 || err != nil || unlocks != 1 || !c.released {
		t.Fatalf("last release = %d, %v (unlocks %d, released %v)", n, err, unlocks, c.released)
	}
	if _, err := s.Release(ctx, lease("n", "o", g)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release after the last: %v", err)
	}
	if s.Len() != 0 {
		t.Fatalf("%d holds listed after release", s.Len())
	}
	if _, err := s.Release(ctx, driver.Lease{Name: "n", Owner: "o", Token: 7}); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release of a lease without its handle: %v", err)
	}
}

func TestSessionsFailures(t *testing.T) {
	ctx := context.Background()
	s, f := newSessions(t)
	// A failed unlock closes the connection and reports loss.
	c, g := acquire(t, s, "a", "o", 1)
	f.unlock = func(context.Context, *fakeConn) error { return errors.New("boom") }
	_, err := s.Release(ctx, lease("a", "o", g))
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
	f.ping = func(_ context.Context, c *fakeConn, ttl time.Duration) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.pings++
		c.lastTTL = ttl
		if c == cc {
			return errors.New("gone")
		}
		return nil
	}
	errs, err := s.Renew(ctx, []driver.Lease{lb, lease("c", "o", gc), lb2, lease("a", "o", g)})
	if err != nil {
		t.Fatal(err)
	}
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
	f.pin = func(context.Context) (*fakeConn, error) { return refused, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return false, 0, nil }
	_, err = s.TryAcquire(ctx, driver.AcquireRequest{Name: "d", Owner: "o"})
	var le *driver.LockedError
	if !errors.As(err, &le) || !refused.released {
		t.Fatalf("refused: %v (released %v)", err, refused.released)
	}
	aborted := false
	f.pin = func(context.Context) (*fakeConn, error) { return &fakeConn{}, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return false, 0, errors.New("broken") }
	f.abort = func(*fakeConn) { aborted = true }
	_, err = s.TryAcquire(ctx, driver.AcquireRequest{Name: "d", Owner: "o"})
	if err == nil || !aborted || s.Get("d") != nil {
		t.Fatalf("failed lock: %v (aborted %v)", err, aborted)
	}
	f.pin, f.lock, f.abort = nil, nil, nil
	if _, err := s.TryAcquire(ctx, driver.AcquireRequest{Name: "d", Owner: "o", LockDelay: time.Second}); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("lock-delay: %v", err)
	}
}

func TestSessionsCloseAndKill(t *testing.T) {
	s, f := newSessions(t)
	b := NewBase("test", s, func(context.Context) error { return nil })
	c, g := acquire(t, s, "a", "o", 1)
	if !b.Close() {
		t.Fatal("first Close did not report first")
	}
	if !c.wasDiscarded() || !errors.Is(g.Cause(), driver.ErrSessionLost) || s.Len() != 0 {
		t.Fatalf("after Close: discarded %v, cause %v (want one wrapping ErrSessionLost, as the Grant.Cause contract says), %d holds listed", c.wasDiscarded(), g.Cause(), s.Len())
	}
	if b.Close() {
		t.Fatal("second Close reported first")
	}
	if err := b.Check(); err == nil {
		t.Fatal("Check after Close = nil")
	}
	// A grant the server made while Close ran is not listed: its
	// connection is closed and the acquire fails.
	late := &fakeConn{}
	f.pin = func(context.Context) (*fakeConn, error) { return late, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return true, 2, nil }
	if _, err := s.TryAcquire(context.Background(), driver.AcquireRequest{Name: "b", Owner: "o", TTL: time.Minute}); err == nil || !late.wasDiscarded() {
		t.Fatalf("Acquire after Close: %v (discarded %v)", err, late.wasDiscarded())
	}

	k, _ := newSessions(t)
	kb := NewBase("test", k, func(context.Context) error { return nil })
	kc, _ := acquire(t, k, "a", "o", 1)
	kb.Kill()
	if !kc.abandoned || kc.discarded || kc.closed {
		t.Fatalf("after Kill: abandoned %v, discarded %v, closed %v", kc.abandoned, kc.discarded, kc.closed)
	}
	if err := kb.Check(); !errors.Is(err, ErrKilled) {
		t.Fatalf("Check after Kill = %v", err)
	}
	if first := kb.Close(); first || !kc.closed {
		t.Fatalf("Close after Kill: first %v, socket closed %v", first, kc.closed)
	}
}

// TestHoldLost: a grant's Lost is open and its Cause nil while the hold
// lives; the first of many concurrent losses closes Lost and its cause
// (wrapping ErrSessionLost and ErrNotHeld) is the one Cause reports.
func TestHoldLost(t *testing.T) {
	s, _ := newSessions(t)
	c, g := acquire(t, s, "a", "o", 1)
	select {
	case <-g.Lost:
		t.Fatal("Lost closed on a live hold")
	default:
	}
	if g.Cause() != nil {
		t.Fatalf("cause %v on a live hold", g.Cause())
	}
	h := g.Handle.(*Hold[*fakeConn])
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); s.destroy(h, SessionLost(nil)) }()
	}
	wg.Wait()
	<-g.Lost
	if c := g.Cause(); !errors.Is(c, driver.ErrSessionLost) || !errors.Is(c, driver.ErrNotHeld) {
		t.Fatalf("cause %v", c)
	}
	if !c.discarded {
		t.Fatal("connection not closed")
	}
	s.destroy(h, errors.New("later"))
	if c := g.Cause(); !errors.Is(c, driver.ErrSessionLost) {
		t.Fatalf("a later loss replaced the cause: %v", c)
	}
}

// acquireTTL is acquire with a TTL of its own.
func acquireTTL(t *testing.T, s *Sessions[*fakeConn], name, owner string, token uint64, ttl time.Duration) (*fakeConn, driver.Grant) {
	t.Helper()
	c := &fakeConn{}
	f := s.sql.(*fakeSQL)
	f.pin = func(context.Context) (*fakeConn, error) { return c, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return true, token, nil }
	g, err := s.TryAcquire(context.Background(), driver.AcquireRequest{Name: name, Owner: owner, TTL: ttl})
	f.pin, f.lock = nil, nil
	if err != nil {
		t.Fatal(err)
	}
	return c, g
}

// TestHoldExpires: a hold nobody renews expires one TTL after its last
// confirmed Lock or Ping: its connection is closed, it leaves the table,
// Lost closes with a cause wrapping ErrSessionLost, and the next acquire
// asks the server. Before that, a re-entry runs from the hold's last
// confirmation and another owner is told how long the hold has left.
// (Before the fix the hold stayed listed for ever once its leases had been
// lost by their deadlines, which the dlock package does not report.)
func TestHoldExpires(t *testing.T) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	s, f := newSessions(t)
	before := time.Now()
	c, g := acquireTTL(t, s, "n", "o", 3, ttl)
	if g.Sent.Before(before) || g.TTL != ttl {
		t.Fatalf("grant Sent %v (call at %v), TTL %v", g.Sent, before, g.TTL)
	}
	g2, err := s.TryAcquire(ctx, driver.AcquireRequest{Name: "n", Owner: "o", TTL: 10 * time.Second})
	if err != nil || !g2.Sent.Equal(g.Sent) || g2.TTL != ttl || g2.Count != 2 {
		t.Fatalf("re-entry: %+v, %v; want Sent %v and TTL %v of the hold", g2, err, g.Sent, ttl)
	}
	_, err = s.TryAcquire(ctx, driver.AcquireRequest{Name: "n", Owner: "x", TTL: ttl})
	var le *driver.LockedError
	if !errors.As(err, &le) || le.Token != 3 || le.RetryAfter <= 0 || le.RetryAfter > ttl {
		t.Fatalf("other owner: %v (%+v), want a LockedError with token 3 and RetryAfter in (0, %v]", err, le, ttl)
	}
	// A renewal moves the expiry.
	f.ping = func(context.Context, *fakeConn, time.Duration) error { return nil }
	time.Sleep(ttl / 2) // the hold ages: that is the point
	pinged := time.Now()
	if errs, err := s.Renew(ctx, []driver.Lease{lease("n", "o", g)}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	select {
	case <-g.Lost:
		t.Fatalf("hold lost %v after a renewal", time.Since(pinged))
	case <-time.After(time.Until(g.Sent.Add(ttl + ttl/4))):
	}
	// Nobody renews it again: it expires.
	deadline := time.After(5 * time.Second)
	select {
	case <-g.Lost:
	case <-deadline:
		t.Fatal("hold never expired")
	}
	if lostAfter := time.Since(pinged); lostAfter < ttl {
		t.Fatalf("lost %v after a renewal, want at least %v", lostAfter, ttl)
	}
	if cause := g.Cause(); !errors.Is(cause, driver.ErrSessionLost) || !errors.Is(cause, driver.ErrNotHeld) {
		t.Fatalf("cause %v", cause)
	}
	// expire signals the loss first, then unlists the hold and closes
	// its connection.
	testwait.Until(t, 10*time.Second, "the expired hold to be unlisted and its connection closed", func() bool {
		c.mu.Lock()
		discarded := c.discarded
		c.mu.Unlock()
		return discarded && s.Len() == 0
	})
	if _, err := s.Release(ctx, lease("n", "o", g)); !errors.Is(err, driver.ErrSessionLost) {
		t.Fatalf("release of an expired hold: %v", err)
	}
	// The next acquire asks the server (Pin runs).
	_, g3 := acquireTTL(t, s, "n", "x", 4, ttl)
	if g3.Token != 4 {
		t.Fatalf("token %d", g3.Token)
	}

	// An acquire that finds an expired hold whose timer has not run yet
	// (a process just resumed from a stop) ends it itself.
	h := g3.Handle.(*Hold[*fakeConn])
	h.mu.Lock()
	s.unschedule(h) // as if its expiry had not come up yet
	c3 := h.conn
	h.mu.Unlock()
	for time.Now().Before(g3.Sent.Add(ttl)) {
		time.Sleep(10 * time.Millisecond) // wait out the hold's TTL
	}
	_, g4 := acquireTTL(t, s, "n", "y", 5, ttl)
	if g4.Token != 5 || !c3.wasDiscarded() {
		t.Fatalf("acquire over an expired hold: token %d, old connection closed %v", g4.Token, c3.wasDiscarded())
	}
	<-g3.Lost
	s.Close()
}

// TestHoldSize: a Hold, kept per held session lock, stays within the 128 B
// size class with a connection of two words (mysqllock's pinned): it kept
// its key in Sessions.holds (a second copy of the name's header), its loss
// signal as a context and its cancel function, and a whole word for its
// count, 160 B in all, until the key was made again when needed, the loss
// signal kept as one *ConnLoss and the kind and count packed.
func TestHoldSize(t *testing.T) {
	type twoWords struct {
		*fakeConn
		_ *int
	}
	if n := unsafe.Sizeof(Hold[twoWords]{}); n > 128 {
		t.Fatalf("a Hold with a two-word connection is %d B, want at most 128", n)
	}
}

// lostSink keeps what TestConnLossSize makes from being optimised away.
var lostSink <-chan struct{}

// TestConnLossSize: a connection's loss signal, with the channel a grant
// hands out, costs 2 allocations (3 with the grant's Cause): it was a
// context.WithCancelCause (the signal, the context, its cancel function
// and the Done channel made on first use: 5 with the Cause), kept per
// pinned connection for as long as its lock is held.
func TestConnLossSize(t *testing.T) {
	h := &Hold[*fakeConn]{}
	allocs := testing.AllocsPerRun(100, func() {
		h.loss = NewConnLoss()
		lostSink = h.grant().Lost
	})
	if allocs > 3 {
		t.Fatalf("a loss signal and a grant's Lost channel take %v allocations, want at most 3", allocs)
	}
}
