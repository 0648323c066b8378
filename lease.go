package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// Lease is one grant of a lock. It is valid until Done is closed; Err then
// says why it ended. A Lease is safe for concurrent use.
//
// A Lease is kept alive by its Client's renewal goroutine. If renewal cannot
// confirm the lease before its local validity deadline (measured on the
// monotonic clock from when the acquire request was sent, minus the drift
// margin), or the backend reports it gone, the lease is lost: Done closes,
// Context is cancelled and Err returns an error wrapping ErrLeaseLost. Work
// protected by the lock should watch Done (or use Context) and pass Token to
// the resource it writes, so that a resource that checks fencing tokens can
// refuse a holder that lost its lease without knowing it yet.
type Lease struct {
	c       *Client
	name    string
	owner   string
	token   uint64
	key     string // the driver's Grant.Key
	handle  any
	kind    driver.Kind
	permits int
	delay   time.Duration
	drift   time.Duration
	// grantedAt is when the grant was reported to the Client's Hooks
	// (LeaseStart), on the Client's clock; see observed.
	grantedAt int64
	lost      <-chan struct{}
	cause     func() error
	parent    context.Context // the context Lock was called with, for Context's values
	count     int32
	autoRenew bool
	generated bool // owner generated for this grant alone (no explicit Owner)

	// Guarded by c.mu: the lease's places in the Client's books.
	registered bool
	prev, next *Lease        // in the Client's list of its leases
	keys       [nHeaps]int64 // schedule keys, on the Client's clock
	pos        [nHeaps]int32 // positions in the Client's heaps, -1 if absent

	mu        sync.Mutex
	releasing bool
	// observed is set, with grantedAt, when the Client's Hooks were told of
	// the grant, before the lease is shared (so it needs no lock; it sits
	// here to use the padding); end then tells them of its end.
	observed   bool
	renewFails uint16 // automatic renewals failed in a row (saturating)
	ttl        time.Duration
	renewEvery time.Duration
	validUntil int64 // local monotonic deadline, on the Client's clock
	err        error
	sig        *leaseSignals // made on first use of Done or Context
}

// leaseSignals are a Lease's Done channel and Context, made on first use:
// most leases end without anyone asking for them.
type leaseSignals struct {
	done   chan struct{}
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// closedChan is the Done channel of a lease that ended before anyone asked.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

func newLease(c *Client, m *Mutex, r resolved, g driver.Grant, sent time.Time, parent context.Context) *Lease {
	ttl := r.ttl
	if g.TTL > 0 {
		ttl = g.TTL
	}
	drift := r.drift
	if g.TTL > 0 && g.TTL != r.ttl && c.opts.Drift == 0 {
		drift = defaultDrift(g.TTL)
	}
	every := r.renew
	if !r.renewSet || every == 0 {
		every = ttl / 3
	}
	at := c.at(sent)
	return &Lease{
		c: c, name: m.name, owner: r.owner, token: g.Token, key: g.Key, count: int32(g.Count), handle: g.Handle,
		kind: m.kind, permits: m.permits,
		delay: r.delay, drift: drift, lost: g.Lost, cause: g.Cause, parent: parent,
		autoRenew: every > 0,
		generated: r.generated,
		keys:      [nHeaps]int64{byRenew: at + int64(every)}, // filed by register
		pos:       [nHeaps]int32{-1, -1, -1},
		ttl:       ttl, renewEvery: every,
		validUntil: at + int64(ttl-drift),
	}
}

// Name returns the lock's name.
func (l *Lease) Name() string { return l.name }

// Owner returns the owner token the lease was granted to.
func (l *Lease) Owner() string { return l.owner }

// Token returns the fencing token: strictly greater than every token granted
// before for this name on this backend, to any holder. Re-entering keeps the
// token. Pass it to the resource the lock protects (see package fence).
//
// Each lock type counts on its own: a read or write lease's token is greater
// than every earlier grant of the name's RWMutex (so read leases of one
// RWMutex carry distinct tokens), and a permit's greater than every earlier
// permit of the name's Semaphore. Mutex, RWMutex and Semaphore locks of one
// name are different locks with separate counters.
func (l *Lease) Token() uint64 { return l.token }

// Key names where the backend keeps the grant (the etcd key, the ZooKeeper
// node, the Redis key), for operators and logs; empty when the driver does
// not say. It never changes.
func (l *Lease) Key() string { return l.key }

// TTL is the lease's time to live as granted: the requested TTL, or the
// one the backend chose (a session-bound backend's session TTL), as changed
// by Extend. Each renewal extends the lease by it. Safe for concurrent use.
func (l *Lease) TTL() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ttl
}

// Kind returns what the lease holds: "mutex" (Mutex), "read" or "write"
// (RWMutex.RLock, RWMutex.Lock) or "permit" (Semaphore).
func (l *Lease) Kind() string { return l.kind.String() }

// Count returns the hold count the backend reported when this lease was
// granted: 1, or more if the owner re-entered.
func (l *Lease) Count() int { return int(l.count) }

// Done returns a channel closed when the lease ends: released, lost, or its
// client closed. Every call returns the same channel, except once the lease
// has ended (any closed channel then).
func (l *Lease) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sig == nil || l.sig.done == nil {
		if l.err != nil {
			return closedChan
		}
		if l.sig == nil {
			l.sig = &leaseSignals{}
		}
		l.sig.done = make(chan struct{})
	}
	return l.sig.done
}

// Err returns nil while the lease is held; afterwards an error wrapping
// ErrReleased, ErrLeaseLost (and its cause) or ErrClosed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a context cancelled when Done closes, carrying the values
// of the context Lock was called with. context.Cause reports Err. Every call
// returns the same context.
func (l *Lease) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sig == nil {
		l.sig = &leaseSignals{}
	}
	if l.sig.ctx == nil {
		l.sig.ctx, l.sig.cancel = context.WithCancelCause(context.WithoutCancel(l.parent))
		if l.err != nil {
			l.sig.cancel(l.err)
		}
	}
	return l.sig.ctx
}

// ValidFor returns how long the lease is known to be valid from now, by the
// local monotonic clock (zero once it ended).
func (l *Lease) ValidFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0
	}
	return max(time.Duration(l.validUntil-l.c.now()), 0)
}

// Extend sets the lease's TTL to ttl from now on the server and uses ttl for
// later automatic renewals. It returns ErrNotHeld if the lease has ended (and
// ends it with ErrLeaseLost if the server no longer has it). It runs on a
// context detached from ctx's cancellation, bounded by the client's
// ReleaseTimeout, so that its outcome is always known.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l.c.hooks == nil {
		return l.extend(ctx, ttl)
	}
	t, tctx := l.c.startOp(ctx, OpInfo{Op: "extend", Name: l.name, Kind: l.kind.String(), Token: l.token})
	if ctx != nil {
		ctx = tctx
	}
	err := l.extend(ctx, ttl)
	t.end(err, 0)
	return err
}

func (l *Lease) extend(ctx context.Context, ttl time.Duration) error {
	if ttl < minTTL || ttl > maxDuration {
		return invalid("TTL", "must be between %v and %v, got %v", minTTL, maxDuration, ttl)
	}
	if ttl < l.c.limits.MinTTL {
		return invalid("TTL", "must be at least %v on this backend, got %v", l.c.limits.MinTTL, ttl)
	}
	l.mu.Lock()
	if l.err != nil || l.releasing {
		l.mu.Unlock()
		return fmt.Errorf("dlock: extend %q: %w", l.name, ErrNotHeld)
	}
	dl := l.driverLeaseLocked()
	l.mu.Unlock()
	dl.TTL = ttl
	rctx, cancel := l.c.detached(ctx)
	defer cancel()
	sent := time.Now()
	errs, err := l.c.d.Renew(rctx, []driver.Lease{dl})
	if err == nil && len(errs) == 1 {
		err = errs[0]
	} else if err == nil {
		err = fmt.Errorf("driver returned %d results for 1 lease", len(errs))
	}
	if err != nil {
		if gone(err) {
			l.lose(err)
			return fmt.Errorf("dlock: extend %q: %w", l.name, ErrNotHeld)
		}
		return l.c.wrap("extend", l.name, rctx, err)
	}
	drift := l.c.opts.Drift
	if drift == 0 {
		drift = defaultDrift(ttl)
	}
	l.mu.Lock()
	l.ttl, l.drift = ttl, drift
	if l.autoRenew {
		l.renewEvery = ttl / 3
	}
	l.confirmedLocked(sent)
	l.mu.Unlock()
	return nil
}

// Unlock gives up the lease. It is owner-only: it never touches a lock that
// another holder has taken since. After a successful Unlock the lock is free
// at once (no lock-delay), Done is closed and Err returns ErrReleased. If the
// lease had already ended (lost, released or closed), Unlock returns an error
// wrapping ErrNotHeld and changes nothing on the server.
//
// Unlock runs on a context detached from ctx's cancellation, bounded by the
// client's ReleaseTimeout, so a cancelled request never leaves a lock held
// until its TTL. If the release fails with its outcome unknown (the backend
// could not be reached, the reply was lost), Unlock returns that error and the
// lease ends locally (renewal stops, Err wraps ErrReleased), and the Client
// keeps retrying the release in the background, with backoff, until the
// backend confirms it, the grant's session ends, the lease has certainly
// expired on the server, or the Client is closed (Close makes one last
// attempt). No live session keeps a lock its owner gave up. A lease with an
// explicit MutexOptions.Owner is the exception: its release is not retried,
// since a retry of a release that did take effect would give up another hold
// of the same owner; its lock is freed when its TTL or session ends.
func (l *Lease) Unlock(ctx context.Context) error {
	if l.c.hooks == nil {
		return l.unlock(ctx)
	}
	t, tctx := l.c.startOp(ctx, OpInfo{Op: "unlock", Name: l.name, Kind: l.kind.String(), Token: l.token})
	if ctx != nil {
		ctx = tctx
	}
	err := l.unlock(ctx)
	t.end(err, 0)
	return err
}

func (l *Lease) unlock(ctx context.Context) error {
	if !l.beginRelease() {
		return fmt.Errorf("dlock: unlock %q: %w", l.name, ErrNotHeld)
	}
	rctx, cancel := l.c.detached(ctx)
	defer cancel()
	dl := l.driverLease()
	_, err := l.c.d.Release(rctx, dl)
	switch {
	case err == nil:
		l.end(ErrReleased)
		return nil
	case gone(err):
		l.lose(err)
		return fmt.Errorf("dlock: unlock %q: %w", l.name, ErrNotHeld)
	default:
		what := "retried in the background"
		if !l.generated {
			what = "the lock is freed when its TTL or session ends"
		}
		l.end(fmt.Errorf("%w (release failed, %s: %v)", ErrReleased, what, err))
		l.c.releaseUnknown("unlock", dl, l.lost, l.generated, err)
		return l.c.wrap("unlock", l.name, rctx, err)
	}
}

// detached returns a context that keeps ctx's values but not its
// cancellation, bounded by ReleaseTimeout.
func (c *Client) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx == nil {
		ctx = context.Background()
	}
	return context.WithTimeout(context.WithoutCancel(ctx), c.opts.ReleaseTimeout)
}

// beginRelease marks the lease as being released so renewal leaves it alone;
// false if it has ended or is already being released.
func (l *Lease) beginRelease() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.releasing {
		return false
	}
	// The lease stays in the renewal heaps until it ends (renewBatch skips
	// it), so that an Unlock takes Client.mu once, in unregister.
	l.releasing = true
	return true
}

func (l *Lease) driverLease() driver.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.driverLeaseLocked()
}

func (l *Lease) driverLeaseLocked() driver.Lease {
	return driver.Lease{Name: l.name, Owner: l.owner, Token: l.token, Handle: l.handle, TTL: l.ttl, LockDelay: l.delay,
		Kind: l.kind, Permits: l.permits}
}

// confirmedLocked records a successful renewal whose request was sent at sent.
func (l *Lease) confirmedLocked(sent time.Time) {
	if l.err != nil {
		return
	}
	at := l.c.at(sent)
	if valid := at + int64(l.ttl-l.drift); valid > l.validUntil {
		l.validUntil = valid
		l.c.mu.Lock()
		if l.registered {
			l.c.scheduleDeadlineLocked(l)
		}
		l.c.mu.Unlock()
	}
	l.renewalLocked(at + int64(l.renewEvery))
}

// lose ends the lease with ErrLeaseLost wrapping cause, and logs the loss
// at Error.
func (l *Lease) lose(cause error) {
	if l.end(&lostError{cause: cause}) {
		l.c.log.Error("dlock: lease lost", "backend", l.c.backend, "name", l.name, "kind", l.kind.String(),
			"token", l.token, "cause", cause)
	}
}

// end finishes the lease once; it reports whether this call ended it.
func (l *Lease) end(err error) bool {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return false
	}
	l.err = err
	// Done and Context asked for from now on come already ended: only
	// those made before are ended here.
	var done chan struct{}
	var cancel context.CancelCauseFunc
	if l.sig != nil {
		done, cancel = l.sig.done, l.sig.cancel
	}
	ttl := l.ttl
	l.mu.Unlock()
	l.c.unregister(l)
	if l.observed {
		l.c.leaseEnded(l, ttl, err)
	}
	if cancel != nil {
		cancel(err)
	}
	if done != nil {
		close(done)
	}
	return true
}

type lostError struct{ cause error }

func (e *lostError) Error() string {
	if e.cause == nil {
		return ErrLeaseLost.Error()
	}
	return ErrLeaseLost.Error() + ": " + e.cause.Error()
}

func (e *lostError) Unwrap() []error { return []error{ErrLeaseLost, e.cause} }

// gone reports whether a driver's answer says the grant no longer exists on
// the server: the owner does not hold it, or the session it was bound to has
// ended (which takes every grant on it).
func gone(err error) bool {
	return errors.Is(err, ErrNotHeld) || errors.Is(err, driver.ErrSessionLost)
}
