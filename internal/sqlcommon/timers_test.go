package sqlcommon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestPoolWaitNoDeadline: an uncontended wait for a pool connection runs
// its call under a context with no deadline, so no runtime timer is armed
// for it (a context.WithTimeout per call armed one, and that woke the Go
// netpoller on every acquire); the PoolWait bound is kept by one timer
// shared by all the waits (TestWaitsBound, TestWaitsOneTimer).
func TestPoolWaitNoDeadline(t *testing.T) {
	for i := 0; i < 3; i++ {
		v, err := WithPoolWait(context.Background(), "x: pinning a connection", "hint",
			func() (int, int) { return 0, 4 },
			func(ctx context.Context) (int, error) {
				if d, ok := ctx.Deadline(); ok {
					t.Fatalf("the call runs under a context with a deadline (%v from now): a runtime timer per wait", time.Until(d))
				}
				if ctx.Err() != nil {
					t.Fatalf("the call's context has ended: %v", ctx.Err())
				}
				return 7, nil
			})
		if v != 7 || err != nil {
			t.Fatalf("WithPoolWait = %d, %v", v, err)
		}
	}
}

// TestWaitsBound: a call that does not return is cut at its bound, not
// before: its context ends, the error carries context.DeadlineExceeded
// (and the call's own error, when it is more than the cut), and says the
// pool was exhausted when every connection was in use. Waits started one after another are each cut at
// their own bound; one that returns in time is not cut, and one whose own
// context ends first is not reported as a full pool.
func TestWaitsBound(t *testing.T) {
	const limit = 100 * time.Millisecond
	ws := &waits{limit: limit}
	block := func(ctx context.Context) (int, error) { <-ctx.Done(); return 0, ctx.Err() }
	full := func() (int, int) { return 4, 4 }

	type result struct {
		start, end time.Time
		err        error
	}
	var wg sync.WaitGroup
	res := make([]result, 4)
	for i := range res {
		wg.Add(1)
		start := time.Now()
		go func() {
			defer wg.Done()
			_, err := withWait(ws, context.Background(), "x: pinning a connection", "hint", full, block)
			res[i] = result{start, time.Now(), err}
		}()
		time.Sleep(limit / 3) // staggered starts: that is the point
	}
	// A call that returns in time, among them.
	if v, err := withWait(ws, context.Background(), "x", "hint", full, func(context.Context) (int, error) { return 1, nil }); v != 1 || err != nil {
		t.Fatalf("a call that returns at once: %d, %v", v, err)
	}
	wg.Wait()
	for i, r := range res {
		if took := r.end.Sub(r.start); took < limit {
			t.Errorf("wait %d cut after %v, before its bound %v", i, took, limit)
		}
		if !errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled) {
			t.Errorf("wait %d: %v, want context.DeadlineExceeded in the chain, for the context.Canceled the call saw", i, r.err)
		}
		if !strings.Contains(r.err.Error(), "no free connection within") {
			t.Errorf("wait %d: %q does not say the pool was exhausted", i, r.err)
		}
	}
	// A call that reports more than the cut keeps its error in the chain.
	dial := errors.New("dial: connection timed out")
	_, err := withWait(ws, context.Background(), "x", "hint", func() (int, int) { return 0, 4 }, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, errors.Join(dial, ctx.Err())
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, dial) || strings.Contains(err.Error(), "no free connection") {
		t.Fatalf("a hung dial cut short: %v, want its error and context.DeadlineExceeded, and no word of a full pool", err)
	}
	// The caller's own context ending first is no exhausted pool.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = withWait(ws, ctx, "x", "hint", full, block)
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "no free connection") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a cancelled caller: %v", err)
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.head != nil || ws.tail != nil {
		t.Fatal("finished waits still listed")
	}
}

// TestWaitsOneTimer: a stream of short waits arms the shared timer once,
// not once per wait.
func TestWaitsOneTimer(t *testing.T) {
	ws := &waits{limit: time.Hour}
	for i := 0; i < 1000; i++ {
		if _, err := withWait(ws, context.Background(), "x", "hint", func() (int, int) { return 0, 4 },
			func(context.Context) (int, error) { return 0, nil }); err != nil {
			t.Fatal(err)
		}
	}
	ws.mu.Lock()
	arms := ws.timer.Arms()
	ws.timer.Stop()
	ws.mu.Unlock()
	if arms != 1 {
		t.Fatalf("1000 waits armed the timer %d times, want 1", arms)
	}
}

// TestHoldsOneTimer: a stream of uncontended Lock+Unlock arms the holds'
// shared expiry timer once, not once per hold.
func TestHoldsOneTimer(t *testing.T) {
	s, f := newSessions(t)
	f.unlock = func(context.Context, *fakeConn) error { return nil }
	for i := 0; i < 1000; i++ {
		_, g := acquire(t, s, "n", "o", uint64(i+1))
		if _, err := s.Release(context.Background(), lease("n", "o", g)); err != nil {
			t.Fatal(err)
		}
	}
	s.expMu.Lock()
	arms, listed := s.exp.timer.Arms(), len(s.exp.heap)
	s.expMu.Unlock()
	if arms != 1 || listed != 0 {
		t.Fatalf("1000 holds armed the expiry timer %d times and left %d listed, want 1 and 0", arms, listed)
	}
	s.Close()
}

// holdSink keeps what TestHoldAllocs makes from being optimised away.
var holdSink driver.Grant

// TestHoldAllocs: an uncontended Lock+Unlock through Sessions makes no
// timer of its own. A time.AfterFunc per hold (its Timer and the function
// it runs: 2 allocations, 152 B) armed a runtime timer at each grant,
// which woke the Go netpoller on every acquire.
func TestHoldAllocs(t *testing.T) {
	s, f := newSessions(t)
	defer s.Close()
	c := &fakeConn{}
	f.pin = func(context.Context) (*fakeConn, error) { return c, nil }
	f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return true, 1, nil }
	f.unlock = func(context.Context, *fakeConn) error { return nil }
	ctx := context.Background()
	req := driver.AcquireRequest{Name: "n", Owner: "o", TTL: time.Minute}
	cycle := func() {
		g, err := s.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Release(ctx, lease("n", "o", g)); err != nil {
			t.Fatal(err)
		}
		holdSink = g
	}
	cycle()
	// The hold, its ConnLoss (a fakeConn keeps none) and the channel in
	// it, and the grant's Cause method value.
	allocs := testing.AllocsPerRun(200, cycle)
	t.Logf("%v allocations per Lock+Unlock", allocs)
	if allocs > 4 {
		t.Fatalf("an uncontended Lock+Unlock takes %v allocations, want at most 4 (no timer per hold)", allocs)
	}
}

// TestHoldsExpireInOrder: holds of different TTLs, none renewed, each
// expire when their own TTL has run out and not before, whatever order
// they were granted in; a renewal with a shorter TTL brings one's expiry
// forward, and a renewal of another moves it later.
func TestHoldsExpireInOrder(t *testing.T) {
	s, f := newSessions(t)
	defer s.Close()
	f.ping = func(context.Context, *fakeConn, time.Duration) error { return nil }
	ttls := []time.Duration{400, 100, 300, 50, 200, 250, 150}
	type held struct {
		c *fakeConn
		g driver.Grant
	}
	var hs []held
	for i, ms := range ttls {
		name := string(rune('a' + i))
		c, g := acquireTTL(t, s, name, "o", uint64(i+1), ms*time.Millisecond)
		hs = append(hs, held{c, g})
	}
	// "a" (400 ms) is renewed at once with 60 ms: its expiry comes forward.
	a := hs[0]
	renewed := time.Now()
	if errs, err := s.Renew(context.Background(), []driver.Lease{{Name: "a", Owner: "o", Token: a.g.Token, Handle: a.g.Handle, TTL: 60 * time.Millisecond}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	lost := make([]time.Time, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-h.g.Lost:
				lost[i] = time.Now()
			case <-time.After(10 * time.Second):
			}
		}()
	}
	wg.Wait()
	for i, h := range hs {
		if lost[i].IsZero() {
			t.Fatalf("hold %d (TTL %v) never expired", i, h.g.TTL)
		}
		from, ttl := h.g.Sent, h.g.TTL
		if i == 0 {
			from, ttl = renewed, 60*time.Millisecond
		}
		if lost[i].Before(from.Add(ttl)) {
			t.Errorf("hold %d lost %v after its last confirmation, before its TTL %v", i, lost[i].Sub(from), ttl)
		}
	}
	if lost[0].After(lost[1]) {
		t.Errorf("the hold renewed with 60 ms expired after the 100 ms one: its expiry did not come forward")
	}
	testwait.Until(t, 10*time.Second, "every expired hold to be unlisted", func() bool { return s.Len() == 0 })
	s.expMu.Lock()
	listed := len(s.exp.heap)
	s.expMu.Unlock()
	if listed != 0 {
		t.Fatalf("%d expired holds still in the timetable", listed)
	}
	for i, h := range hs {
		if !h.c.wasDiscarded() {
			t.Errorf("hold %d: connection not closed", i)
		}
	}
}

// TestHoldsExpireTogether: holds that expire together all signal their
// loss even while closing one's connection hangs (a dead network): each
// loss comes before any close.
func TestHoldsExpireTogether(t *testing.T) {
	s, f := newSessions(t)
	defer s.Close()
	const ttl = 100 * time.Millisecond
	block := make(chan struct{})
	var gs []driver.Grant
	for i := 0; i < 4; i++ {
		c := &fakeConn{block: block}
		f.pin = func(context.Context) (*fakeConn, error) { return c, nil }
		f.lock = func(context.Context, *fakeConn) (bool, uint64, error) { return true, uint64(i + 1), nil }
		g, err := s.TryAcquire(context.Background(), driver.AcquireRequest{Name: string(rune('a' + i)), Owner: "o", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	// Every expiry is due at once.
	s.expMu.Lock()
	for _, e := range s.exp.heap {
		e.h.mu.Lock()
		e.h.sent = gs[0].Sent
		e.h.mu.Unlock()
	}
	for i := range s.exp.heap {
		s.exp.heap[i].end = gs[0].Sent.Add(ttl).Sub(epoch)
	}
	s.expMu.Unlock()
	defer close(block)
	for i, g := range gs {
		select {
		case <-g.Lost:
		case <-time.After(10 * time.Second):
			t.Fatalf("hold %d: no loss signalled while another's connection close hangs", i)
		}
	}
}

// TestPoolWaitPastDeadline: a call that fails in its own words (a dial's
// "i/o timeout") once the caller's deadline has passed reports that
// deadline as well, so a waiting Lock cut off by its context ends with the
// context's error and does not take it for a backend failure to retry
// (seen in mysqllock's TestCancelAsWaitEnds under load: a dial for the
// pinned connection timed out at the Lock's 1 ms deadline).
func TestPoolWaitPastDeadline(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	ioTimeout := errors.New("dial tcp 127.0.0.1:1: i/o timeout")
	_, err := WithPoolWait(ctx, "x: pinning a connection", "hint",
		func() (int, int) { return 0, 4 },
		func(context.Context) (int, error) { return 0, ioTimeout })
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ioTimeout) {
		t.Fatalf("WithPoolWait = %v, want the context's deadline and the call's own error", err)
	}
}
