package sqlcommon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// Conn is a connection pinned from a pool for as long as one session-bound
// lock is held. Each driver wraps its own connection type in it; the SQL
// that takes, pings and gives up the lock stays in the driver.
type Conn interface {
	comparable
	// Release returns the connection to its pool. It is called after the
	// lock was given up cleanly.
	Release()
	// Discard closes the connection instead of returning it, which ends the
	// session and with it any lock the session still has.
	Discard()
	// Abandon detaches the connection from its pool without any traffic
	// (a simulated crash) and returns the function that later closes its
	// socket.
	Abandon() (closeLater func())
}

// Hold is one lock held in a session mode: the pinned connection and the
// local re-entrance count (the server is asked once per hold). It is the
// driver.Grant.Handle of every grant on it.
type Hold[C Conn] struct {
	name  string
	owner string
	token uint64
	lost  *Lost

	mu    sync.Mutex // serialises use of conn
	conn  C          // zero once released, lost or abandoned
	count int
}

// Name returns the lock name h holds.
func (h *Hold[C]) Name() string { return h.name }

// Conn returns h's connection while it is pinned. It takes h's lock, so it
// must not be called from inside a callback that already has it.
func (h *Hold[C]) Conn() (C, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var zero C
	return h.conn, h.conn != zero
}

func (h *Hold[C]) grant(ttl time.Duration) driver.Grant {
	return driver.Grant{Token: h.token, Count: h.count, TTL: ttl, Handle: h, Lost: h.lost.C(), Cause: h.lost.Cause}
}

// destroy closes h's connection (ending its session and its lock) and
// signals loss with cause. The caller must not hold h.mu.
func (h *Hold[C]) destroy(cause error) {
	h.mu.Lock()
	var zero C
	if h.conn != zero {
		h.conn.Discard()
		h.conn = zero
	}
	h.mu.Unlock()
	h.lost.Close(cause)
}

// Sessions is the bookkeeping of a driver's session-bound locks: the holds
// by name, re-entrance, loss, and the driver's closed and killed state.
// Lock order: a Hold's lock before the Sessions lock.
// All methods are safe for concurrent use. The zero value is not usable; use
// NewSessions.
type Sessions[C Conn] struct {
	prefix string // the driver's name, leading every error

	mu        sync.Mutex
	holds     map[string]*Hold[C]
	closed    bool
	killed    bool
	abandoned []func() // socket closers of a killed driver's connections
}

// NewSessions returns an empty table for the driver named prefix (for
// example "pglock"), which leads its error messages.
func NewSessions[C Conn](prefix string) *Sessions[C] {
	return &Sessions[C]{prefix: prefix, holds: map[string]*Hold[C]{}}
}

// Check returns ErrKilled after Kill, an error after Close, and nil before.
func (s *Sessions[C]) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.killed:
		return ErrKilled
	case s.closed:
		return errors.New(s.prefix + ": driver is closed")
	}
	return nil
}

// Len returns the number of holds listed.
func (s *Sessions[C]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.holds)
}

// Get returns the hold listed under name, or nil.
func (s *Sessions[C]) Get(name string) *Hold[C] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holds[name]
}

// Acquire takes req in a session mode named mode. A name this driver
// already holds never reaches the server: another owner gets a LockedError
// carrying the held token, the same owner a grant with the count raised by
// one. Otherwise pin gets a connection from the pool (its error is returned
// as it is), lock asks the server for the lock on it and returns the fencing
// token, and the connection stays pinned while the lock is held. If lock
// fails, abort gets the connection back to a known state or closes it; if
// the server refuses, the connection goes back to the pool and the result
// is a LockedError. Lock-delay is not supported: a session lock ends with
// its connection.
func (s *Sessions[C]) Acquire(ctx context.Context, req driver.AcquireRequest, mode string,
	pin func(context.Context) (C, error),
	lock func(context.Context, C) (ok bool, token uint64, err error),
	abort func(C)) (driver.Grant, error) {
	if req.LockDelay > 0 {
		return driver.Grant{}, Unsupported(mode)
	}
	if g, ok, err := s.reenter(req); ok {
		return g, err
	}
	conn, err := pin(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	ok, token, err := lock(ctx, conn)
	if err != nil {
		abort(conn)
		return driver.Grant{}, fmt.Errorf("%s: acquire: %w", s.prefix, err)
	}
	if !ok {
		conn.Release()
		return driver.Grant{}, &driver.LockedError{}
	}
	return s.add(req, token, conn)
}

// reenter handles an acquire of a name this driver already holds. ok is
// false when the driver holds nothing live under req.Name and must ask the
// server.
func (s *Sessions[C]) reenter(req driver.AcquireRequest) (g driver.Grant, ok bool, err error) {
	h := s.Get(req.Name)
	if h == nil {
		return driver.Grant{}, false, nil
	}
	h.mu.Lock()
	var zero C
	if h.conn != zero {
		if h.owner != req.Owner {
			tok := h.token
			h.mu.Unlock()
			return driver.Grant{}, true, &driver.LockedError{Token: tok}
		}
		h.count++
		g := h.grant(req.TTL)
		h.mu.Unlock()
		return g, true, nil
	}
	h.mu.Unlock()
	s.drop(h) // lost or released meanwhile: acquire afresh
	return driver.Grant{}, false, nil
}

// add lists a lock the server has just granted on conn with the fencing
// token and returns its first grant. If the driver was closed meanwhile,
// conn is discarded and add fails.
func (s *Sessions[C]) add(req driver.AcquireRequest, token uint64, conn C) (driver.Grant, error) {
	h := &Hold[C]{name: req.Name, owner: req.Owner, token: token, conn: conn, count: 1, lost: NewLost()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		h.destroy(errors.New(s.prefix + ": driver closed"))
		return driver.Grant{}, errors.New(s.prefix + ": driver is closed")
	}
	// A hold still listed under this name is finished on the server (the
	// server just granted the lock to this connection): it is mid-release
	// or lost, and its own goroutine removes nothing but itself. Replacing
	// it here, without touching its lock, keeps the lock order h.mu → s.mu.
	s.holds[req.Name] = h
	s.mu.Unlock()
	return h.grant(req.TTL), nil
}

// lookup finds the hold behind l and checks that l is a grant on it.
func (s *Sessions[C]) lookup(l driver.Lease) (*Hold[C], error) {
	h, _ := l.Handle.(*Hold[C])
	if h == nil || h.name != l.Name || h.owner != l.Owner || h.token != l.Token {
		return nil, fmt.Errorf("%s: lease was not granted by this driver: %w", s.prefix, driver.ErrNotHeld)
	}
	return h, nil
}

// drop removes h from the table if it is still there.
func (s *Sessions[C]) drop(h *Hold[C]) {
	s.mu.Lock()
	if s.holds[h.name] == h {
		delete(s.holds, h.name)
	}
	s.mu.Unlock()
}

// Release gives up one grant of l. Above one, the count goes down and the
// server is not asked. The last release calls unlock on the pinned
// connection (under the hold's lock) and then returns the connection to its
// pool; if unlock fails the session's state is unknown, so the connection
// is closed, which ends the session and any lock it still had, and the
// hold reports loss.
func (s *Sessions[C]) Release(ctx context.Context, l driver.Lease, unlock func(context.Context, C) error) (int, error) {
	h, err := s.lookup(l)
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var zero C
	if h.conn == zero {
		if c := h.lost.Cause(); c != nil {
			return 0, fmt.Errorf("%s: release: %w", s.prefix, c)
		}
		return 0, fmt.Errorf("%s: release: %w", s.prefix, driver.ErrNotHeld)
	}
	if h.count > 1 {
		h.count--
		return h.count, nil
	}
	err = unlock(ctx, h.conn)
	s.drop(h)
	conn := h.conn
	h.conn = zero
	h.count = 0
	if err != nil {
		conn.Discard()
		cause := SessionLost(err)
		h.lost.Close(cause)
		return 0, fmt.Errorf("%s: release: %w", s.prefix, cause)
	}
	conn.Release()
	return 0, nil
}

// Renew pings the connection behind each distinct hold in ls, at most 16 at
// once, with the longest TTL asked for it. A failed ping ends the hold: its
// connection is closed, so whatever lock it had is gone on the server too,
// and every lease on it gets an error wrapping driver.ErrSessionLost.
func (s *Sessions[C]) Renew(ctx context.Context, ls []driver.Lease, ping func(context.Context, C, time.Duration) error) []error {
	errs := make([]error, len(ls))
	type job struct {
		h   *Hold[C]
		ttl time.Duration
		idx []int
	}
	jobs := map[*Hold[C]]*job{}
	var order []*job
	for i, l := range ls {
		h, err := s.lookup(l)
		if err != nil {
			errs[i] = err
			continue
		}
		j := jobs[h]
		if j == nil {
			j = &job{h: h}
			jobs[h] = j
			order = append(order, j)
		}
		j.ttl = max(j.ttl, l.TTL)
		j.idx = append(j.idx, i)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, j := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := s.ping(ctx, j.h, j.ttl, ping)
			for _, i := range j.idx {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

func (s *Sessions[C]) ping(ctx context.Context, h *Hold[C], ttl time.Duration, ping func(context.Context, C, time.Duration) error) error {
	h.mu.Lock()
	var zero C
	if h.conn == zero {
		h.mu.Unlock()
		if c := h.lost.Cause(); c != nil {
			return c
		}
		return fmt.Errorf("%s: renew: %w", s.prefix, driver.ErrNotHeld)
	}
	err := ping(ctx, h.conn, ttl)
	h.mu.Unlock()
	if err != nil {
		cause := SessionLost(err)
		s.drop(h)
		h.destroy(cause)
		return fmt.Errorf("%s: renew: %w", s.prefix, cause)
	}
	return nil
}

// Close closes the sockets Kill abandoned and marks the driver closed. The
// first call returns the holds that were listed, for the caller to end with
// EndAll (after stopping its own background work); later calls return
// first false.
func (s *Sessions[C]) Close() (holds []*Hold[C], first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, closeLater := range s.abandoned {
		closeLater()
	}
	s.abandoned = nil
	if s.closed {
		return nil, false
	}
	s.closed = true
	return s.take(), true
}

// EndAll closes the connections of holds, which frees their locks on the
// server, and signals their loss.
func (s *Sessions[C]) EndAll(holds []*Hold[C]) {
	for _, h := range holds {
		h.destroy(errors.New(s.prefix + ": driver closed"))
	}
}

// Kill simulates a crash for the test harness: the driver is marked closed
// and killed, and every pinned connection is abandoned as it is (no unlock,
// no more traffic, so the server frees the locks only when the sessions
// end). Close closes the abandoned sockets.
func (s *Sessions[C]) Kill() {
	s.mu.Lock()
	s.killed = true
	s.closed = true
	holds := s.take()
	s.mu.Unlock()
	var zero C
	for _, h := range holds {
		h.mu.Lock()
		if h.conn != zero {
			closeLater := h.conn.Abandon()
			h.conn = zero
			s.mu.Lock()
			s.abandoned = append(s.abandoned, closeLater)
			s.mu.Unlock()
		}
		h.mu.Unlock()
	}
}

func (s *Sessions[C]) take() []*Hold[C] {
	hs := make([]*Hold[C], 0, len(s.holds))
	for _, h := range s.holds {
		hs = append(hs, h)
	}
	s.holds = map[string]*Hold[C]{}
	return hs
}
