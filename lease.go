package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	c      *Client
	name   string
	owner  string
	token  uint64
	handle any
	key    string // the driver's Grant.Key
	// parent answers Value as the context Lock was called with did, for
	// Context's values: that context without the value-less cancellation
	// layers on its top (see valuesOf); nil for context.Background. It is
	// kept here rather than in leaseExtra: most leases have one (a
	// program's root context, shared by all of them), and a leaseExtra
	// made for it would cost 64 B more than the field.
	parent context.Context
	// x holds what most leases never need (see leaseExtra); nil while all
	// of it is zero. Set before the lease is shared, or later under mu;
	// once set it is never replaced.
	x *leaseExtra

	// Guarded by c.mu: the lease's places in the Client's heaps (see
	// renew.go). Every registered lease is in the byDeadline heap, which
	// is also the Client's list of its leases.
	keys       [byDeadline]int64 // renewal schedule keys, on the Client's clock
	pos        [nHeaps]int32     // positions in the Client's heaps, -1 if absent
	registered bool

	kind  driver.Kind
	flags leaseFlags // set before the lease is shared
	state leaseState // guarded by mu

	mu  sync.Mutex
	ttl time.Duration
	// validUntil is the local monotonic deadline, on the Client's clock,
	// and the lease's key in the byDeadline heap: written with both mu and
	// c.mu held once the lease is registered, read under either.
	validUntil int64
}

// leaseFlags are a Lease's settings that never change once it is shared.
type leaseFlags uint8

const (
	autoRenew leaseFlags = 1 << iota // renewed by the Client's renewer
	generated                        // owner generated for this grant alone (no explicit Owner)
	observed                         // the Client's Hooks were told of the grant (LeaseStart)
	watched                          // bound to a driver loss channel (in a lostWatcher)
)

// leaseState is where a Lease is in its life (guarded by Lease.mu).
type leaseState uint8

const (
	stateLive      leaseState = iota
	stateReleasing            // Unlock or Close is releasing it; renewal leaves it alone
	stateEnded                // Err is set
)

// leaseExtra holds the parts of a Lease that most leases never need, so that
// a held lease costs little heap: a lock-delay, a semaphore's size, an
// explicit renewal interval, a hold count other than 1, the Hooks' grant
// time, renewal failures, an end other than a plain release, and the Done
// channel and Context. Its fields are set before the lease is shared or
// under Lease.mu.
type leaseExtra struct {
	delay      time.Duration
	permits    int
	renewEvery time.Duration // when renewSet: the explicit renewal interval
	// grantedAt is when the grant was reported to the Client's Hooks
	// (LeaseStart), on the Client's clock; see observed.
	grantedAt  int64
	err        error  // Err once ended, unless it is ErrReleased
	count      int32  // the hold count, when hasCount (otherwise 1)
	renewFails uint16 // automatic renewals failed in a row (saturating)
	renewSet   bool
	hasCount   bool
	sig        *leaseSignals // made on first use of Done or Context
}

// extraLocked returns l.x, making it if need be (l.mu held, or l not yet
// shared).
func (l *Lease) extraLocked() *leaseExtra {
	if l.x == nil {
		l.x = &leaseExtra{}
	}
	return l.x
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
	l := &Lease{
		c: c, name: keyedName(m.name, g.Key), owner: r.owner, token: g.Token, key: g.Key, handle: g.Handle,
		kind: m.kind, parent: valuesOf(parent),
		pos: [nHeaps]int32{-1, -1, -1},
		ttl: ttl,
	}
	if r.generated {
		l.flags |= generated
	}
	if r.delay != 0 {
		l.extraLocked().delay = r.delay
	}
	if m.permits != 0 {
		l.extraLocked().permits = m.permits
	}
	if g.Count != 1 {
		x := l.extraLocked()
		x.count, x.hasCount = int32(g.Count), true
	}
	if r.renewSet && r.renew != 0 {
		x := l.extraLocked()
		x.renewEvery, x.renewSet = r.renew, true
	}
	every := l.renewEveryLocked()
	if every > 0 {
		l.flags |= autoRenew
	}
	at := c.at(sent)
	l.keys[byRenew] = at + int64(every) // filed by register
	l.validUntil = at + int64(ttl-l.driftLocked())
	return l
}

// keyedName returns name, as a slice of key when key holds it (an etcd key,
// a ZooKeeper path, a Redis key usually do): the lease keeps key anyway, and
// the caller's name string, often made for the one Lock (fmt.Sprintf), is
// then not kept alive by the lease.
func keyedName(name, key string) string {
	if name == "" {
		return name
	}
	if i := strings.Index(key, name); i >= 0 {
		return key[i : i+len(name)]
	}
	return name
}

// renewEveryLocked is how often l is renewed (l.mu held, or l not yet
// shared): a third of its TTL unless set explicitly (negative: never).
func (l *Lease) renewEveryLocked() time.Duration {
	if x := l.x; x != nil && x.renewSet {
		return x.renewEvery
	}
	return l.ttl / 3
}

// driftLocked is the margin taken off l's validity (l.mu held, or l not
// yet shared): Options.Drift, or by default a share of its TTL.
func (l *Lease) driftLocked() time.Duration {
	if d := l.c.opts.Drift; d != 0 {
		return d
	}
	return defaultDrift(l.ttl)
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
func (l *Lease) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if x := l.x; x != nil && x.hasCount {
		return int(x.count)
	}
	return 1
}

// Done returns a channel closed when the lease ends: released, lost, or its
// client closed. Every call returns the same channel, except once the lease
// has ended (any closed channel then).
func (l *Lease) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	sig := l.sigLocked()
	if sig.done == nil {
		if l.state == stateEnded {
			return closedChan
		}
		sig.done = make(chan struct{})
	}
	return sig.done
}

// Err returns nil while the lease is held; afterwards an error wrapping
// ErrReleased, ErrLeaseLost (and its cause) or ErrClosed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errLocked()
}

// errLocked is Err with l.mu held.
func (l *Lease) errLocked() error {
	switch {
	case l.state != stateEnded:
		return nil
	case l.x != nil && l.x.err != nil:
		return l.x.err
	}
	return ErrReleased
}

// sigLocked returns l's signals, making them if need be (l.mu held).
func (l *Lease) sigLocked() *leaseSignals {
	x := l.extraLocked()
	if x.sig == nil {
		x.sig = &leaseSignals{}
	}
	return x.sig
}

// Context returns a context cancelled when Done closes, carrying the values
// of the context Lock was called with. context.Cause reports Err. Every call
// returns the same context.
func (l *Lease) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	sig := l.sigLocked()
	if sig.ctx == nil {
		sig.ctx, sig.cancel = context.WithCancelCause(detachedValues(l.parent))
		if l.state == stateEnded {
			sig.cancel(l.errLocked())
		}
	}
	return sig.ctx
}

// ValidFor returns how long the lease is known to be valid from now, by the
// local monotonic clock (zero once it ended).
func (l *Lease) ValidFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validForLocked()
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
	if l.state != stateLive {
		l.mu.Unlock()
		return fmt.Errorf("dlock: extend %q: %w", l.name, ErrNotHeld)
	}
	dl := l.driverLeaseLocked()
	l.mu.Unlock()
	dl.TTL = ttl
	rctx := l.c.detached(ctx)
	defer rctx.stop()
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
	l.mu.Lock()
	l.ttl = ttl // the drift follows (driftLocked)
	if l.flags&autoRenew != 0 && l.x != nil {
		l.x.renewSet = false // renewed every ttl/3 from now on
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
	rctx := l.c.detached(ctx)
	defer rctx.stop()
	dl := l.driverLease()
	_, err := l.c.d.Release(rctx, dl)
	gen := l.flags&generated != 0
	switch {
	case err == nil:
		l.end(ErrReleased)
		return nil
	case gone(err):
		l.lose(err)
		return fmt.Errorf("dlock: unlock %q: %w", l.name, ErrNotHeld)
	default:
		what := "retried in the background"
		if !gen {
			what = "the lock is freed when its TTL or session ends"
		}
		lost := l.c.lostOf(l) // before end takes l out of its watcher
		l.end(fmt.Errorf("%w (release failed, %s: %v)", ErrReleased, what, err))
		l.c.releaseUnknown("unlock", dl, lost, gen, err)
		return l.c.wrap("unlock", l.name, rctx, err)
	}
}

// beginRelease marks the lease as being released so renewal leaves it alone;
// false if it has ended or is already being released.
func (l *Lease) beginRelease() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateLive {
		return false
	}
	// The lease stays in the renewal heaps until it ends (renewBatch skips
	// it), so that an Unlock takes Client.mu once, in unregister.
	l.state = stateReleasing
	return true
}

func (l *Lease) driverLease() driver.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.driverLeaseLocked()
}

func (l *Lease) driverLeaseLocked() driver.Lease {
	dl := driver.Lease{Name: l.name, Owner: l.owner, Token: l.token, Handle: l.handle, TTL: l.ttl, Kind: l.kind}
	if x := l.x; x != nil {
		dl.LockDelay, dl.Permits = x.delay, x.permits
	}
	return dl
}

// confirmedLocked records a successful renewal whose request was sent at sent.
func (l *Lease) confirmedLocked(sent time.Time) {
	if l.state == stateEnded {
		return
	}
	at := l.c.at(sent)
	if valid := at + int64(l.ttl-l.driftLocked()); valid > l.validUntil {
		l.c.mu.Lock()
		l.validUntil = valid
		if l.registered {
			l.c.scheduleDeadlineLocked(l)
		}
		l.c.mu.Unlock()
	}
	l.renewalLocked(at + int64(l.renewEveryLocked()))
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
	if l.state == stateEnded {
		l.mu.Unlock()
		return false
	}
	l.state = stateEnded
	if err != ErrReleased {
		l.extraLocked().err = err
	}
	// Done and Context asked for from now on come already ended: only
	// those made before are ended here.
	var done chan struct{}
	var cancel context.CancelCauseFunc
	var grantedAt int64
	if x := l.x; x != nil {
		if x.sig != nil {
			done, cancel = x.sig.done, x.sig.cancel
		}
		grantedAt = x.grantedAt
	}
	ttl := l.ttl
	// Taken out of the Client's books before l.mu is let go, so that
	// whoever finds l ended finds it gone from them too (the reaper).
	l.c.unregister(l)
	l.mu.Unlock()
	if l.flags&observed != 0 {
		l.c.leaseEnded(l, ttl, grantedAt, err)
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
