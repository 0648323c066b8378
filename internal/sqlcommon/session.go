package sqlcommon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
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

// ConnLoss is the loss signal of one pinned connection: the Grant.Lost of
// every hold made on it, one after another, until a hold on it is lost
// (which always ends the connection). Holds on one connection sharing it
// let the dlock Client keep one idle loss watcher for the next grant on the
// connection, where a signal of its own per hold made the Client start a
// goroutine to watch every grant.
//
// It is a channel and a cause, not a context.WithCancelCause: a
// connection pinned by a held lock keeps it for as long as the lock is
// held, and the context (the context, its cancel function and, once Done
// is asked for, its channel: 4 allocations, about 240 B) cost twice what
// this does (2 allocations, 128 B; TestConnLossSize).
type ConnLoss struct {
	mu    sync.Mutex
	done  chan struct{} // closed once lost
	cause error         // why, set before done is closed; nil until then
}

// NewConnLoss returns a loss signal not yet ended.
func NewConnLoss() *ConnLoss { return &ConnLoss{done: make(chan struct{})} }

// Ended reports whether the loss was signalled; a connection keeping an
// ended one must replace it before its next hold.
func (l *ConnLoss) Ended() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// lose signals the loss with cause (context.Canceled if nil); the first
// call wins, as a context's cancel.
func (l *ConnLoss) lose(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cause == nil {
		l.cause = cause
		close(l.done)
	}
}

// why returns the cause of the loss, nil while it is not signalled.
func (l *ConnLoss) why() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cause
}

// LossKeeper is a Conn that keeps a ConnLoss for as long as its
// connection lives (a connection returned to the pool after a clean
// release keeps it for its next hold). Loss returns it, or a new one if it
// has ended. A Conn that is no LossKeeper gets a loss signal per hold.
type LossKeeper interface {
	Loss() *ConnLoss
}

// SessionSQL is the SQL of one session mode (a lock that lives as long as
// its pinned connection: an advisory lock, GET_LOCK, a row lock in an open
// transaction) over the driver's pinned-connection type C. Sessions calls
// it; the bookkeeping (re-entrance, loss, Close) stays in Sessions.
type SessionSQL[C Conn] interface {
	// Pin takes a connection from the pool to hold req's lock on. Its error
	// is returned to the caller as it is.
	Pin(ctx context.Context, req driver.AcquireRequest) (C, error)
	// Lock asks the server for req's lock on c and returns the fencing
	// token. ok is false, with a nil error, when the lock is held by another
	// session; c must then be as it was before Lock, fit to go back to the
	// pool.
	Lock(ctx context.Context, c C, req driver.AcquireRequest) (ok bool, token uint64, err error)
	// Abort undoes a Lock that failed with an error (the lock may have been
	// taken before the failure): it gives the lock up and returns c to the
	// pool, or closes c when that fails.
	Abort(c C)
	// Unlock gives up the lock on name that c holds (the last release).
	Unlock(ctx context.Context, c C, name string) error
	// Ping proves c's session alive and re-arms its server-side idle
	// timeout to ttl.
	Ping(ctx context.Context, c C, ttl time.Duration) error
}

// SessionBlocker is a SessionSQL whose server can keep a session waiting
// for a mutex (pg_advisory_lock, GET_LOCK with a timeout): Block is Lock
// that waits up to wait for the lock to be freed before it refuses (ok
// false and a nil error, c as before Lock). The server grants the lock to
// its waiting sessions in the order they asked, at once when it is freed.
type SessionBlocker[C Conn] interface {
	Block(ctx context.Context, c C, req driver.AcquireRequest, wait time.Duration) (ok bool, token uint64, err error)
}

// CancelGrace bounds how long CancelOnDone's cancel of a waiting statement
// may take (the cancel itself, and the statement's answer to it): past it,
// the statement's context is cancelled, which closes its connection.
const CancelGrace = time.Second

// CancelOnDone runs query, a statement that may wait in the server, on a
// context that ctx's end does not cancel; when ctx ends first, it calls
// cancel, which asks the server to end the statement (a PostgreSQL cancel
// request, a MySQL KILL QUERY from another connection), so that its
// session stops waiting at once. The database drivers' own reaction to a
// cancelled context, closing the connection, would leave the server's
// session waiting in the lock's queue until it noticed, and then holding
// the lock it was granted. If cancel fails, or the statement has not
// answered within CancelGrace, the statement's context is cancelled after
// all. When ctx ended, the error is ctx's (wrapping the statement's, if
// any): even a statement that succeeded must be undone, so the caller
// aborts; cancel has returned by then, so the caller may close the
// connection.
func CancelOnDone(ctx context.Context, cancel func(context.Context) error, query func(context.Context) error) error {
	qctx, interrupt := context.WithCancel(context.WithoutCancel(ctx))
	defer interrupt()
	watched := make(chan struct{})
	watching := context.AfterFunc(ctx, func() {
		defer close(watched)
		// The cancel's own context is not the statement's: a statement
		// that answers on its own while its cancel is on the way must not
		// cut the cancel short, or the server may run a cancel the client
		// gave up on later, against whatever the connection runs next.
		cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), CancelGrace)
		defer stop()
		if cancel(cctx) != nil {
			interrupt()
			return
		}
		select {
		case <-qctx.Done(): // the statement returned
		case <-cctx.Done():
		}
		interrupt()
	})
	err := query(qctx)
	if watching() {
		return err
	}
	// The watcher ran: stop its wait for the statement, and let its
	// cancel finish before the caller does anything else with the
	// connection.
	interrupt()
	<-watched
	if err == nil {
		return fmt.Errorf("%w (its wait was ended)", ctx.Err())
	}
	return fmt.Errorf("%w: %w", ctx.Err(), err)
}

// Hold is one lock held in a session mode: the pinned connection and the
// local re-entrance count (the server is asked once per hold). It is the
// driver.Grant.Handle of every grant on it.
//
// A hold expires one TTL after the send time of the Lock or Ping that last
// proved its session alive, unless a later Ping succeeds: by then every
// lease on it has passed its validity deadline (the dlock package counts
// from its own send time, which came first), nobody renews it any more (a
// lease whose deadline passed is not renewed, and not released either),
// and the server's idle timeout ends, or is about to end, its session. An
// expired hold closes its connection (which frees the lock on the server
// at once if the session still lives, and gives the pool its slot back),
// leaves the table, and reports loss. Without this a hold whose leases were
// all lost by their deadline (a process stopped past its TTL and resumed)
// stayed listed with its dead connection, and every later acquire of the
// name from the same driver was refused locally, without asking the server,
// for as long as the process ran.
//
// A Hold is kept for as long as its lock is held, so it is kept small (see
// TestHoldSize): its key in Sessions.holds is not stored but made again
// from the name, kind and owner (HoldKey; the name itself for a mutex).
type Hold[C Conn] struct {
	name  string
	owner string
	token uint64
	// loss ends, with the cause, when the hold is gone without a release
	// asked for by its owner: driver.Grant.Lost and Cause read it. Holds
	// made one after another on one connection share it (LossKeeper).
	loss *ConnLoss

	mu    sync.Mutex  // serialises use of conn
	kind  driver.Kind // with count, fills the word after mu
	count int32
	conn  C // zero once released, lost or abandoned
	// sent is when the Lock or Ping that last proved the session alive was
	// sent, ttl the idle timeout it armed; the hold expires at sent+ttl.
	sent time.Time
	ttl  time.Duration
	// at is h's place in its Sessions' expiries plus one, 0 while it is
	// not listed there (Sessions.expMu guards it). A hold is listed from
	// its grant until its connection is zeroed.
	at int
}

// Name returns the lock name h holds.
func (h *Hold[C]) Name() string { return h.name }

// Kind returns the kind of lock h holds.
func (h *Hold[C]) Kind() driver.Kind { return h.kind }

// Owner returns the owner h was granted to.
func (h *Hold[C]) Owner() string { return h.owner }

// Token returns the fencing token of h's grant.
func (h *Hold[C]) Token() uint64 { return h.token }

// key returns the key h is listed under in Sessions.holds (see HoldKey).
func (h *Hold[C]) key() string {
	return HoldKey(driver.AcquireRequest{Name: h.name, Kind: h.kind, Owner: h.owner})
}

// lose signals h's loss with cause.
func (h *Hold[C]) lose(cause error) { h.loss.lose(cause) }

// HoldKey returns the key a session-mode hold of req is listed under in
// Sessions: the name for a mutex and a write lock's other side, and for
// a read hold the name, kind and owner, since several owners' reads of one
// name share it, each on its own connection.
func HoldKey(req driver.AcquireRequest) string {
	switch req.Kind {
	case driver.Exclusive:
		return req.Name
	case driver.Read, driver.Permit:
		return req.Name + "\x00" + req.Kind.String() + "\x00" + req.Owner
	}
	return req.Name + "\x00" + req.Kind.String()
}

// Conn returns h's connection while it is pinned. It takes h's lock, so it
// must not be called from inside a callback that already has it.
func (h *Hold[C]) Conn() (C, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var zero C
	return h.conn, h.conn != zero
}

// grant returns a grant on h: its lease runs from h.sent for h.ttl, the
// idle timeout armed on the server by the statement sent then (a
// re-entrance does not reach the server, so nothing later extends it).
// h.mu is held.
func (h *Hold[C]) grant() driver.Grant {
	return driver.Grant{Token: h.token, Count: int(h.count), TTL: h.ttl, Sent: h.sent, Handle: h, Lost: h.loss.done, Cause: h.cause}
}

// expiresIn returns how long until h expires (see Hold); h.mu is held.
func (h *Hold[C]) expiresIn() time.Duration { return time.Until(h.sent.Add(h.ttl)) }

// expires returns when h expires (see Hold); h.mu is held.
func (h *Hold[C]) expires() time.Time { return h.sent.Add(h.ttl) }

// confirmed records a Lock or Ping sent at sent that armed ttl and
// succeeded, and moves h's expiry in s; h.mu is held.
func (s *Sessions[C]) confirmed(h *Hold[C], sent time.Time, ttl time.Duration) {
	if sent.After(h.sent) || ttl != h.ttl {
		h.sent, h.ttl = sent, ttl
	}
	s.schedule(h)
}

// detach zeroes h's connection and takes it off s's expiries, returning
// the connection it had; h.mu is held.
func (s *Sessions[C]) detach(h *Hold[C]) C {
	var zero C
	conn := h.conn
	h.conn = zero
	h.count = 0
	s.unschedule(h)
	return conn
}

// cause returns why h was lost, or nil while it is not.
func (h *Hold[C]) cause() error { return h.loss.why() }

// destroy closes h's connection (ending its session and its lock) and
// signals loss with cause. Loss is signalled under h.mu, before the
// connection is zeroed, so a Release or Renew that finds no connection
// always finds the cause. A hold whose connection is already gone was
// released cleanly (its connection may be pinned by another hold now, which
// shares its loss signal, see LossKeeper) or lost already: it is left as
// it is. The caller must not hold h.mu.
func (s *Sessions[C]) destroy(h *Hold[C], cause error) {
	h.mu.Lock()
	var zero C
	if h.conn != zero {
		h.lose(cause)
		s.detach(h).Discard()
	}
	h.mu.Unlock()
}

// Sessions is a Locker for a session mode: the bookkeeping of a driver's
// session-bound locks (the holds by name, re-entrance, loss, the closed and
// killed state, expiry) around the mode's SQL.
//
// The holds' expiries share one timer (see expiries), armed for the
// earliest: a timer per hold, armed at its grant and stopped at its
// release, woke the Go netpoller (an eventfd write and a thread wake-up)
// on every uncontended Lock+Unlock.
//
// Lock order: a Hold's lock before the Sessions lock, and before expMu;
// mu and expMu are never held together.
// All methods are safe for concurrent use. The zero value is not usable; use
// NewSessions.
type Sessions[C Conn] struct {
	prefix string // the driver's name, leading every error
	mode   string // the mode's name, for errors
	sql    SessionSQL[C]

	mu        sync.Mutex
	holds     map[string]*Hold[C]
	closed    bool
	abandoned []func() // socket closers of a killed driver's connections

	expMu sync.Mutex
	exp   expiries[C]
}

// NewSessions returns an empty table for the driver named prefix (for
// example "pglock"), which leads its error messages, in the session mode
// named mode, whose SQL is sql.
func NewSessions[C Conn](prefix, mode string, sql SessionSQL[C]) *Sessions[C] {
	return &Sessions[C]{prefix: prefix, mode: mode, sql: sql, holds: map[string]*Hold[C]{}}
}

// Len returns the number of holds listed; 0 for a nil s (a driver in a
// lease mode).
func (s *Sessions[C]) Len() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.holds)
}

// Get returns the hold listed under key (a mutex's name, see HoldKey),
// or nil; nil for a nil s (a driver in a lease mode).
func (s *Sessions[C]) Get(key string) *Hold[C] {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holds[key]
}

// Find returns the holds of name of kind k listed now.
func (s *Sessions[C]) Find(name string, k driver.Kind) []*Hold[C] {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var hs []*Hold[C]
	for _, h := range s.holds {
		if h.name == name && h.kind == k {
			hs = append(hs, h)
		}
	}
	return hs
}

// TryAcquire implements Locker. A name this driver already holds never
// reaches the server: another owner gets a LockedError carrying the held
// token, the same owner a grant with the count raised by one. Otherwise
// SessionSQL.Pin gets a connection from the pool, Lock asks the server for
// the lock on it, and the connection stays pinned while the lock is held.
// If Lock fails, Abort gets the connection back to a known state or closes
// it; if the server refuses, the connection goes back to the pool and the
// result is a LockedError. Lock-delay is not supported: a session lock ends
// with its connection.
func (s *Sessions[C]) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.LockDelay > 0 {
		return driver.Grant{}, Unsupported(s.mode)
	}
	if g, ok, err := s.reenter(req); ok {
		return g, err
	}
	conn, err := s.sql.Pin(ctx, req)
	if err != nil {
		return driver.Grant{}, err
	}
	sent := time.Now()
	ok, token, err := s.sql.Lock(ctx, conn, req)
	if err != nil {
		s.sql.Abort(conn)
		return driver.Grant{}, ctxerr.Wrap(ctx, s.prefix+": acquire", err)
	}
	if !ok {
		conn.Release()
		return driver.Grant{}, &driver.LockedError{}
	}
	return s.add(req, token, conn, sent)
}

// Blocks reports whether Acquire may wait for req on the server: the mode's
// SQL is a SessionBlocker, req is a mutex without lock-delay, the driver
// does not hold the name for req's owner (a re-entry goes through
// TryAcquire's loop), and fewer than half of the pool's connections
// (acquired, max) are in use: a waiting session pins a connection as a
// held lock does, and waiters must not starve the holders' and other
// locks' acquires of connections. A hold of another owner of this driver
// does not keep req out of the server's queue: kept out, the driver's own
// waiters could only try the lock between the server's hand-offs to the
// waiters of other processes, which never leave it free while they queue,
// and waited for as long as those kept coming (16 s with 9 contenders on 3
// drivers; locktest's Fair).
func (s *Sessions[C]) Blocks(req driver.AcquireRequest, acquired, max int) bool {
	if _, ok := s.sql.(SessionBlocker[C]); !ok || req.Kind != driver.Exclusive || req.LockDelay > 0 {
		return false
	}
	if h := s.Get(HoldKey(req)); h != nil && h.owner == req.Owner {
		return false
	}
	return 2*(acquired+1) <= max
}

// Acquire waits on the server for the mutex req names (see Blocks, which
// the caller asked first): it pins a connection and blocks on it, in turns
// of at most a third of the TTL, so that a grant's lease, counted from the
// send time of the turn that got it, has at least two thirds of the TTL
// left. Between turns it checks whether the driver now holds the name (an
// acquire of the same owner, which then re-enters, or of another owner,
// which the next turn waits for). When ctx ends it returns an error
// wrapping ctx.Err(); a lock the server granted as ctx ended is given up
// (Abort), so nothing is left behind.
func (s *Sessions[C]) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	b, ok := s.sql.(SessionBlocker[C])
	if !ok {
		return driver.Grant{}, fmt.Errorf("%s: acquire: the mode cannot wait on the server: %w", s.prefix, driver.ErrUnsupported)
	}
	conn, err := s.sql.Pin(ctx, req)
	if err != nil {
		return driver.Grant{}, err
	}
	turn := max(req.TTL/3, time.Millisecond)
	for {
		if g, ok, err := s.reenter(req); ok && err == nil {
			conn.Release()
			return g, nil
		}
		sent := time.Now()
		ok, token, err := b.Block(ctx, conn, req, turn)
		if err != nil {
			s.sql.Abort(conn)
			return driver.Grant{}, ctxerr.Wrap(ctx, s.prefix+": acquire", err)
		}
		if ok {
			return s.add(req, token, conn, sent)
		}
		if err := ctx.Err(); err != nil {
			conn.Release()
			return driver.Grant{}, ctxerr.Wrap(ctx, s.prefix+": acquire", err)
		}
	}
}

// reenter handles an acquire of a name this driver already holds. ok is
// false when the driver holds nothing live under req.Name and must ask the
// server. Another owner is refused with the time until the hold expires as
// RetryAfter; the same owner re-enters with a grant that runs from the
// hold's last confirmation (Grant.Sent), not from now. A hold that has
// expired (its expiry timer may not have run yet, for example in a process
// just resumed from a stop) is ended here and the server is asked.
func (s *Sessions[C]) reenter(req driver.AcquireRequest) (g driver.Grant, ok bool, err error) {
	h := s.Get(HoldKey(req))
	if h == nil {
		return driver.Grant{}, false, nil
	}
	h.mu.Lock()
	var zero C
	if h.conn != zero {
		if left := h.expiresIn(); left > 0 {
			if h.owner != req.Owner {
				tok := h.token
				h.mu.Unlock()
				return driver.Grant{}, true, &driver.LockedError{Token: tok, RetryAfter: left}
			}
			h.count++
			g := h.grant()
			h.mu.Unlock()
			return g, true, nil
		}
		h.mu.Unlock()
		s.expire(h)
		return driver.Grant{}, false, nil
	}
	h.mu.Unlock()
	s.drop(h) // lost or released meanwhile: acquire afresh
	return driver.Grant{}, false, nil
}

// expire ends h if it has expired (see Hold): its loss is signalled, it
// leaves the table, and its connection is closed. A hold confirmed
// meanwhile is listed again in s's expiries instead.
func (s *Sessions[C]) expire(h *Hold[C]) {
	if conn, ok := s.expireHold(h); ok {
		conn.Discard()
	}
}

// expireHold is expire but for closing the connection: it returns the
// connection of h if h has expired, for the caller to Discard.
func (s *Sessions[C]) expireHold(h *Hold[C]) (C, bool) {
	h.mu.Lock()
	var zero C
	if h.conn == zero {
		h.mu.Unlock()
		return zero, false
	}
	if left := h.expiresIn(); left > 0 {
		s.schedule(h)
		h.mu.Unlock()
		return zero, false
	}
	h.lose(SessionLost(fmt.Errorf("no renewal within the TTL (%v) since %s; the server's idle timeout ends the session", h.ttl, h.sent.Format(time.RFC3339Nano))))
	conn := s.detach(h)
	h.mu.Unlock()
	s.drop(h)
	return conn, true
}

// add lists a lock the server has just granted on conn with the fencing
// token, by a Lock sent at sent, and returns its first grant. If the driver
// was closed meanwhile, conn is discarded and add fails.
func (s *Sessions[C]) add(req driver.AcquireRequest, token uint64, conn C, sent time.Time) (driver.Grant, error) {
	h := &Hold[C]{kind: req.Kind, name: req.Name, owner: req.Owner, token: token, conn: conn, count: 1, sent: sent, ttl: req.TTL}
	if k, ok := any(conn).(LossKeeper); ok {
		h.loss = k.Loss()
	} else {
		h.loss = NewConnLoss()
	}
	h.mu.Lock()
	s.schedule(h)
	g := h.grant()
	h.mu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.destroy(h, fmt.Errorf("%s: driver closed: %w", s.prefix, driver.ErrSessionLost))
		return driver.Grant{}, errors.New(s.prefix + ": driver is closed")
	}
	// A hold still listed under this name is finished on the server (the
	// server just granted the lock to this connection): it is mid-release
	// or lost, and its own goroutine removes nothing but itself. Replacing
	// it here, without touching its lock, keeps the lock order h.mu → s.mu.
	s.holds[HoldKey(req)] = h
	s.mu.Unlock()
	return g, nil
}

// lookup finds the hold behind l and checks that l is a grant on it.
func (s *Sessions[C]) lookup(l driver.Lease) (*Hold[C], error) {
	h, _ := l.Handle.(*Hold[C])
	if h == nil || h.name != l.Name || h.kind != l.Kind || h.owner != l.Owner || h.token != l.Token {
		return nil, fmt.Errorf("%s: lease was not granted by this driver: %w", s.prefix, driver.ErrNotHeld)
	}
	return h, nil
}

// drop removes h from the table if it is still there.
func (s *Sessions[C]) drop(h *Hold[C]) {
	s.mu.Lock()
	if key := h.key(); s.holds[key] == h {
		delete(s.holds, key)
	}
	s.mu.Unlock()
}

// Release implements Locker: it gives up one grant of l. Above one, the
// count goes down and the server is not asked. The last release calls
// SessionSQL.Unlock on the pinned connection (under the hold's lock) and
// then returns the connection to its pool; if Unlock fails the session's
// state is unknown, so the connection is closed, which ends the session and
// any lock it still had, and the hold reports loss.
func (s *Sessions[C]) Release(ctx context.Context, l driver.Lease) (int, error) {
	h, err := s.lookup(l)
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var zero C
	if h.conn == zero {
		if c := h.cause(); c != nil {
			return 0, fmt.Errorf("%s: release: %w", s.prefix, c)
		}
		return 0, fmt.Errorf("%s: release: %w", s.prefix, driver.ErrNotHeld)
	}
	if h.count > 1 {
		h.count--
		return int(h.count), nil
	}
	err = s.sql.Unlock(ctx, h.conn, h.name)
	s.drop(h)
	if err != nil {
		cause := SessionLost(err)
		h.lose(cause)
		s.detach(h).Discard()
		return 0, fmt.Errorf("%s: release: %w", s.prefix, cause)
	}
	conn := s.detach(h)
	conn.Release()
	return 0, nil
}

// Renew implements Locker: it pings the connection behind each distinct
// hold in ls, at most 16 at once, with the longest TTL asked for it. A
// failed ping ends the hold: its connection is closed, so whatever lock it
// had is gone on the server too, and every lease on it gets an error
// wrapping driver.ErrSessionLost. It never fails as a whole.
func (s *Sessions[C]) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
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
			err := s.ping(ctx, j.h, j.ttl)
			for _, i := range j.idx {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errs, nil
}

func (s *Sessions[C]) ping(ctx context.Context, h *Hold[C], ttl time.Duration) error {
	h.mu.Lock()
	var zero C
	if h.conn == zero {
		h.mu.Unlock()
		if c := h.cause(); c != nil {
			return c
		}
		return fmt.Errorf("%s: renew: %w", s.prefix, driver.ErrNotHeld)
	}
	sent := time.Now()
	err := s.sql.Ping(ctx, h.conn, ttl)
	if err == nil {
		s.confirmed(h, sent, ttl)
	}
	h.mu.Unlock()
	if err != nil {
		cause := SessionLost(err)
		s.drop(h)
		s.destroy(h, cause)
		return fmt.Errorf("%s: renew: %w", s.prefix, cause)
	}
	return nil
}

// Close implements Locker. It closes the sockets Kill abandoned; on the
// first call it also refuses later grants and closes the connections of the
// holds listed, which frees their locks on the server, and signals their
// loss.
func (s *Sessions[C]) Close() {
	s.mu.Lock()
	for _, closeLater := range s.abandoned {
		closeLater()
	}
	s.abandoned = nil
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	holds := s.take()
	s.mu.Unlock()
	for _, h := range holds {
		s.destroy(h, fmt.Errorf("%s: driver closed: %w", s.prefix, driver.ErrSessionLost))
	}
	s.stopExpiries()
}

// Kill implements Locker: later grants are refused and every pinned
// connection is abandoned as it is (no unlock, no more traffic, so the
// server frees the locks only when the sessions end). Close closes the
// abandoned sockets.
func (s *Sessions[C]) Kill() {
	s.mu.Lock()
	s.closed = true
	holds := s.take()
	s.mu.Unlock()
	var zero C
	for _, h := range holds {
		h.mu.Lock()
		if h.conn != zero {
			closeLater := s.detach(h).Abandon()
			s.mu.Lock()
			s.abandoned = append(s.abandoned, closeLater)
			s.mu.Unlock()
		}
		h.mu.Unlock()
	}
	s.stopExpiries()
}

func (s *Sessions[C]) take() []*Hold[C] {
	hs := make([]*Hold[C], 0, len(s.holds))
	for _, h := range s.holds {
		hs = append(hs, h)
	}
	s.holds = map[string]*Hold[C]{}
	return hs
}
