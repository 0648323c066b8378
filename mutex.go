package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
)

// Mutex is a named lock on a Client's backend. A Mutex holds no state on the
// server until Lock or TryLock succeeds, and may be used to take the lock
// many times and from many goroutines; each successful call returns its own
// Lease. Invalid names or options are reported by Lock and TryLock with an
// error wrapping ErrInvalid (or ErrUnsupported for options the backend
// cannot honour).
type Mutex struct {
	c       *Client
	name    string
	kind    driver.Kind // Exclusive for a Mutex; RWMutex and Semaphore use the others
	permits int         // the semaphore's size when kind is Permit
	err     error       // construction error, reported on use
	// r are the lock's settings, read-only: the Client's defaults for a
	// lock made without MutexOptions, else a mutexWithOptions's own. Nil
	// when err is set.
	r *resolved
}

// mutexWithOptions is a Mutex made with MutexOptions and its settings, in
// one allocation. A Mutex without options points at its Client's defaults
// instead, and costs half the heap (64 B, not 128).
type mutexWithOptions struct {
	m Mutex
	r resolved
}

// NewMutex returns the lock called name. opts may be nil for the client's
// defaults.
func (c *Client) NewMutex(name string, opts *MutexOptions) *Mutex {
	return c.newLock(name, driver.Exclusive, 0, opts)
}

// newLock is the machinery behind every lock type: a Mutex of kind k
// (Exclusive, Read, Write or Permit of a semaphore of permits).
func (c *Client) newLock(name string, k driver.Kind, permits int, opts *MutexOptions) *Mutex {
	var m *Mutex
	var r *resolved
	if opts == nil {
		m = &Mutex{c: c, name: name, kind: k, permits: permits}
	} else {
		x := &mutexWithOptions{m: Mutex{c: c, name: name, kind: k, permits: permits}}
		m, r = &x.m, &x.r
	}
	if err := checkName(name, c.d); err != nil {
		m.err = err
		return m
	}
	if err := checkKind(c.d, name, k); err != nil {
		m.err = err
		return m
	}
	if r == nil {
		if m.err = c.defaultsErr; m.err == nil {
			m.r = &c.defaults
		}
		return m
	}
	if *r, m.err = c.resolve(opts); m.err == nil {
		m.r = r
	}
	return m
}

// checkKind refuses a lock kind the driver does not implement, so that a
// backend without read/write locks or semaphores never grants a plain mutex
// in their place.
func checkKind(d driver.Driver, name string, k driver.Kind) error {
	if k == driver.Exclusive {
		return nil
	}
	if kd, ok := d.(driver.Kinder); ok && kd.SupportsKind(k) {
		return nil
	}
	what := "read/write locks"
	if k == driver.Permit {
		what = "semaphores"
	}
	return &OpError{Op: "new", Name: name, Err: fmt.Errorf("this backend (%T) has no %s (%s grants): %w", d, what, k, ErrUnsupported)}
}

// ops names a lock kind's waiting and one-shot operations in errors.
func ops(k driver.Kind) (wait, try string) {
	switch k {
	case driver.Read:
		return "rlock", "tryrlock"
	case driver.Permit:
		return "acquire", "tryacquire"
	}
	return "lock", "trylock"
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Lock takes the lock, waiting while someone else holds it. Waiters are
// woken by the backend on release where it can (Redis pub/sub, PostgreSQL
// NOTIFY, etcd and ZooKeeper watches on the predecessor); otherwise Lock
// retries with jittered exponential backoff, never sleeping past the moment
// the holder's lease runs out.
//
// A wait rides out backend failures, as flock, consul lock and Redisson's
// waits do: an attempt that fails with a backend error (an unreachable or
// paused server, a lost reply, a waiter's session lost while queued) is
// logged at Warn and retried, with jittered backoff between WaitMin and
// WaitMax, until ctx ends. Errors that retrying cannot cure are returned at
// once: invalid arguments (ErrInvalid), options the backend cannot honour
// (ErrUnsupported), and a closed client (ErrClosed). Set
// MutexOptions.FailFast or Options.FailFast to return the first backend error
// instead.
//
// Lock returns when the lock is granted, when ctx is done, when the client is
// closed (ErrClosed), or, with FailFast, on a backend error (*OpError). When
// ctx ends the error wraps ctx.Err() and nothing is left behind on the server;
// if backend errors were retried during the wait, it also wraps the last of
// them (errors.Is finds both), so a caller can tell "the lock stayed held"
// from "the backend was unreachable".
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.acquire(ctx, true)
}

// TryLock makes one attempt to take the lock. It returns an error wrapping
// ErrLocked at once if someone else holds it or it is inside a lock-delay,
// and a backend error (*OpError) at once if the attempt failed: TryLock never
// retries.
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	return m.acquire(ctx, false)
}

// errZeroToken is a driver bug, not a transient failure: never retried.
var errZeroToken = errors.New("driver granted a lock with fencing token 0")

// retryable reports whether a failed attempt of a waiting Lock is worth
// retrying: a backend failure, not bad input, a refused option, a closed
// client or a context that ended.
func retryable(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil,
		errors.Is(err, ErrInvalid), errors.Is(err, ErrUnsupported), errors.Is(err, ErrClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, errZeroToken):
		return false
	}
	return true
}

// acquire takes the lock for a caller: ctx is the caller's context, which
// the lease keeps the values of.
func (m *Mutex) acquire(ctx context.Context, wait bool) (*Lease, error) {
	return m.acquireIn(ctx, ctx, wait)
}

// acquireIn takes the lock; ctx is the context of the work (a MultiMutex's
// operation, for the hooks), parent the caller's, which the lease keeps the
// values of. With Hooks it reports the operation around acquireOp.
func (m *Mutex) acquireIn(ctx, parent context.Context, wait bool) (*Lease, error) {
	if m.c.hooks == nil {
		return m.acquireOp(ctx, parent, wait, nil)
	}
	waitOp, op := ops(m.kind)
	if wait {
		op = waitOp
	}
	t, tctx := m.c.startOp(ctx, OpInfo{Op: op, Name: m.name, Kind: m.kind.String()})
	if ctx != nil {
		ctx = tctx
	}
	l, err := m.acquireOp(ctx, parent, wait, t)
	var token uint64
	if l != nil {
		token = l.token
	}
	t.end(err, token)
	return l, err
}

// acquireOp is acquireIn's work; t follows it for the hooks (nil: none).
func (m *Mutex) acquireOp(ctx, parent context.Context, wait bool, t *opTrace) (*Lease, error) {
	if m.err != nil {
		return nil, m.err
	}
	if ctx == nil || parent == nil {
		return nil, invalid("ctx", "must not be nil")
	}
	c := m.c
	if !c.acquireStarted() {
		return nil, ErrClosed
	}
	defer c.acquireDone()
	r := *m.r
	explicitOwner := r.owner != ""
	if !explicitOwner {
		r.owner, r.generated = newOwner(), true
	}
	req := driver.AcquireRequest{Name: m.name, Owner: r.owner, TTL: r.ttl, LockDelay: r.delay,
		Kind: m.kind, Permits: m.permits, Waiting: wait && (m.kind == driver.Write || m.kind == driver.Exclusive)}
	// writer: a waiting writer leaves a mark that it withdraws (see
	// driver.Withdrawer).
	writer := req.Waiting && req.Kind == driver.Write
	waitOp, op := ops(m.kind)
	if wait {
		op = waitOp
	}
	// A waiting acquire stops when the client closes: it runs on a context
	// that Close cancels (see closeWatch).
	cw := closeWatch{ctx: ctx}
	defer cw.release()
	var q driver.Queuer
	if wait {
		q = c.queuer(req)
	}
	// A QueueChooser's queue is for waiting only: its first attempt is a
	// TryAcquire, so that an uncontended Lock costs what a TryLock does, and
	// only a refused one waits in Acquire.
	_, tryFirst := c.d.(driver.QueueChooser)
	tryFirst = tryFirst && q != nil
	if wait && ((q != nil && !tryFirst) || ctx.Done() == nil) {
		if ctx = cw.arm(c); ctx == nil {
			return nil, ErrClosed
		}
	}

	var (
		g       driver.Grant
		sent    time.Time
		err     error
		lastErr error // the last backend error a waiting Lock retried
		granted bool
	)
	if writer {
		// A waiting writer that gives up withdraws its mark, so that it
		// does not hold new readers back until it expires.
		defer func() {
			if !granted {
				c.withdraw(parent, req)
			}
		}()
	}
	bo := newBackoff(r.waitMin, r.waitMax)
	for {
		switch {
		case tryFirst:
			tryFirst = false
			g, sent, err = m.tryLoop(&cw, req, r, false, explicitOwner, t)
			ctx = cw.ctx
			if errors.Is(err, ErrLocked) {
				// Refused: wait in the driver's queue.
				if ctx = cw.arm(c); ctx == nil {
					return nil, ErrClosed
				}
				g, sent, err = queued(ctx, q, req, t)
			}
		case q != nil:
			g, sent, err = queued(ctx, q, req, t)
		default:
			g, sent, err = m.tryLoop(&cw, req, r, wait, explicitOwner, t)
			ctx = cw.ctx
		}
		if err == nil {
			granted = true
			break
		}
		if wait && c.isClosed() {
			return nil, ErrClosed
		}
		if errors.Is(err, ErrLocked) {
			return nil, fmt.Errorf("dlock: %s %q: %w", op, m.name, err)
		}
		if !wait || r.failFast || !retryable(ctx, err) {
			if lastErr != nil && ctx.Err() != nil {
				return nil, waitEnded(op, m.name, ctx, lastErr)
			}
			return nil, c.wrap(op, m.name, ctx, err)
		}
		lastErr = err
		if ctx = cw.arm(c); ctx == nil {
			return nil, ErrClosed
		}
		if !explicitOwner {
			// A grant of the failed attempt may linger under the old
			// owner until its clean-up release gets through: never
			// re-enter it by accident.
			if writer {
				c.withdraw(parent, req) // the old owner's waiting mark
			}
			r.owner = newOwner()
			req.Owner = r.owner
		}
		d := bo.next()
		c.log.Warn("dlock: lock attempt failed, retrying", "backend", c.backend, "name", m.name, "retry_in", d, "err", err)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			if c.isClosed() {
				return nil, ErrClosed
			}
			return nil, waitEnded(op, m.name, ctx, lastErr)
		case <-t.C:
		}
	}
	return m.finish(ctx, op, r, g, sent, parent)
}

// finish turns a driver's grant into a registered Lease: a grant that
// arrived after its own validity deadline is released and reported as an
// error, and a grant that arrives as the client closes is released.
func (m *Mutex) finish(ctx context.Context, op string, r resolved, g driver.Grant, sent time.Time, parent context.Context) (*Lease, error) {
	c := m.c
	if !g.Sent.IsZero() {
		// The driver knows when the request that last proved the grant's
		// lease was sent: after a long queue wait that is later than our
		// call, but on a shared session (an etcd lease kept alive by its
		// own loop) it can be earlier, and the server counts from then.
		sent = g.Sent
	}
	l := newLease(c, m, r, g, sent, parent)
	if l.ValidFor() == 0 {
		// The grant arrived after its own validity deadline (a very slow
		// reply, or this process was paused): it cannot be relied on.
		dl := l.driverLease()
		rctx := c.detached(ctx)
		_, rerr := c.d.Release(rctx, dl)
		rctx.stop()
		if rerr != nil && !errors.Is(rerr, ErrNotHeld) {
			c.releaseUnknown("late grant", dl, g.Lost, r.generated, rerr)
		}
		l.end(&lostError{cause: errors.New("granted after its validity deadline")})
		return nil, &OpError{Op: op, Name: m.name, Err: fmt.Errorf("the grant arrived after its validity deadline (TTL %v); the lock was released", l.ttl)}
	}
	if c.hooks != nil {
		// Reported before register, so that LeaseEnd, which a loss noticed
		// at once could call, always comes after.
		l.flags |= observed
		l.extraLocked().grantedAt = c.now()
		c.hooks.LeaseStart(c.leaseInfo(l, l.ttl))
	}
	if !c.register(l, g.Lost, g.Cause) {
		rctx := c.detached(ctx)
		_, _ = c.d.Release(rctx, l.driverLease())
		rctx.stop()
		l.end(ErrClosed)
		return nil, ErrClosed
	}
	return l, nil
}

// withdraw tells a Withdrawer that the waiting write request req gave up,
// on a best-effort basis: the driver's mark expires on its own otherwise.
func (c *Client) withdraw(ctx context.Context, req driver.AcquireRequest) {
	w, ok := c.d.(driver.Withdrawer)
	if !ok || c.isClosed() {
		return // a closed driver's marks expire on their own
	}
	wctx := c.detached(ctx)
	defer wctx.stop()
	if err := w.Withdraw(wctx, req); err != nil {
		c.log.Warn("dlock: withdrawing a waiting writer failed; its mark expires on its own", "backend", c.backend, "name", req.Name, "err", err)
	}
}

// waitEnded is the error of a waiting Lock whose context ended after it had
// retried backend errors: it wraps both ctx's error and the last backend
// error.
func waitEnded(op, name string, ctx context.Context, last error) error {
	return fmt.Errorf("dlock: %s %q: %w (after retrying backend errors; the last: %w)", op, name, ctx.Err(), last)
}

// closeWatch makes the context a waiting acquire runs on: the caller's,
// cancelled also when the client closes (the acquire then returns
// ErrClosed). A caller's context that is never cancelled (Done returns nil:
// context.Background, or values over it) is wrapped in a closingCtx, which
// costs one small allocation, before the first attempt. One that can be
// cancelled is wrapped in a waitCtx (one allocation), which makes the
// context of its own and the AfterFunc the merge needs (five allocations
// more, and a lock of closeCtx each way) only when something asks for its
// Done: a driver that waits, or the acquire's own wait between attempts.
// A TryAcquire loop arms it only when the acquire first has to wait: an
// uncontended Lock then costs what a TryLock does, and its one attempt is
// bounded by the caller's context (a Close meanwhile is seen when the
// attempt returns: the grant is released and Lock returns ErrClosed).
// Queued waits (driver.Queuer) are armed before their attempt, which may
// wait.
type closeWatch struct {
	ctx   context.Context // the caller's until armed
	armed bool
	wait  *waitCtx // when the caller's context can be cancelled
}

// arm makes w.ctx the close-watching context if it is not yet; it returns
// it, or nil if the client has closed.
func (w *closeWatch) arm(c *Client) context.Context {
	if !w.armed {
		w.armed = true
		if w.ctx.Done() == nil {
			w.ctx = &closingCtx{Context: w.ctx, c: c}
		} else {
			w.wait = &waitCtx{Context: w.ctx, c: c}
			w.ctx = w.wait
		}
	}
	if c.isClosed() {
		return nil
	}
	return w.ctx
}

// waitCtx is a cancellable caller's context made to end also when its Client
// closes (Err then reports context.Canceled, and context.Cause ErrClosed),
// or when the acquire is over (release). The context that merges both
// (inner: context.WithCancelCause of the caller's, cancelled by an
// AfterFunc on Client.closeCtx) is made by the first Done, the first Value,
// Err or Cause once the Client has closed, or the first of any of those
// after release; until then Err and Value answer as inner would, from the
// caller's context: nothing has cancelled inner but the caller's.
//
// Once inner exists, Value answers from it, so that the context package
// finds inner's cancelCtx behind a context derived from x (it asks Done
// first, which makes inner) and registers the derived context there rather
// than starting a goroutine to watch Done (TestDriverCtxNoGoroutine).
type waitCtx struct {
	context.Context // the caller's
	c               *Client

	mu       sync.Mutex
	inner    context.Context // made by innerCtx
	cancel   context.CancelCauseFunc
	stop     func() bool // the AfterFunc on closeCtx; nil if made after release
	ready    atomic.Bool // inner is set (read without mu)
	released atomic.Bool // the acquire is over: inner is (made) cancelled
}

// innerCtx returns inner, making it if need be: cancelled already if x has
// been released.
func (x *waitCtx) innerCtx() context.Context {
	if x.ready.Load() {
		return x.inner
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.inner == nil {
		ctx, cancel := context.WithCancelCause(x.Context)
		x.inner, x.cancel = ctx, cancel
		switch {
		case x.released.Load():
			cancel(nil)
		case x.c.closeCtx.Err() != nil:
			cancel(ErrClosed) // at once, not from an AfterFunc's goroutine
		default:
			x.stop = context.AfterFunc(x.c.closeCtx, func() { cancel(ErrClosed) })
		}
		x.ready.Store(true)
	}
	return x.inner
}

// settled reports whether something other than the caller's context may
// have ended x (its Client closed, or x was released): inner must answer.
func (x *waitCtx) settled() bool {
	return x.ready.Load() || x.released.Load() || x.c.isClosed()
}

func (x *waitCtx) Done() <-chan struct{} { return x.innerCtx().Done() }

func (x *waitCtx) Err() error {
	if x.settled() {
		return x.innerCtx().Err()
	}
	return x.Context.Err()
}

func (x *waitCtx) Value(key any) any {
	if x.settled() {
		return x.innerCtx().Value(key)
	}
	return x.Context.Value(key)
}

// release ends x (context.Canceled) and lets go of the AfterFunc on
// closeCtx, if inner was made.
func (x *waitCtx) release() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.released.Store(true)
	if x.inner != nil {
		if x.stop != nil {
			x.stop()
		}
		x.cancel(nil)
	}
}

// closingCtx is a context that is never cancelled (its embedded one, whose
// values it carries) made to end when its Client closes.
type closingCtx struct {
	context.Context
	c *Client
}

func (x *closingCtx) Done() <-chan struct{} { return x.c.closeCtx.Done() }
func (x *closingCtx) Err() error            { return x.c.closeCtx.Err() }

// Value is the caller's but for the context package's own key, which finds
// closeCtx's cancelCtx (closeCtx holds no other value, and the caller's
// context, never cancelled, has no cancelCtx to find). So a context derived
// from x, even through values layered over x (a gRPC or etcd client adds
// its metadata that way), is registered as a child of closeCtx instead of
// getting a goroutine of its own to watch Done (TestDriverCtxNoGoroutine).
func (x *closingCtx) Value(key any) any {
	if v := x.c.closeCtx.Value(key); v != nil {
		return v
	}
	return x.Context.Value(key)
}

// AfterFunc lets the context package hang contexts derived from x (a
// driver's WithTimeout) on the Client's closeCtx, as it does for its own
// contexts, rather than start a goroutine per derived context to watch Done.
func (x *closingCtx) AfterFunc(f func()) func() bool { return context.AfterFunc(x.c.closeCtx, f) }

// release lets go of what arm made.
func (w *closeWatch) release() {
	if w.wait != nil {
		w.wait.release()
	}
}

// tryLoop calls TryAcquire until it succeeds, fails for a reason other than
// ErrLocked, or (when wait is false) after the first attempt. It runs on
// cw.ctx, which it arms once it has to wait.
func (m *Mutex) tryLoop(cw *closeWatch, req driver.AcquireRequest, r resolved, wait, explicitOwner bool, t *opTrace) (driver.Grant, time.Time, error) {
	ctx := cw.ctx
	var sub driver.Subscription
	defer func() {
		if sub != nil {
			_ = sub.Close()
		}
	}()
	c := m.c
	// Subscribe only once the lock turns out to be held, so an uncontended
	// Lock costs one round trip. The attempt right after subscribing cannot
	// miss a release that happened before the subscription.
	var notify <-chan struct{}
	triedSubscribe := false
	subscribe := func() {
		n, ok := c.d.(driver.Notifier)
		if !ok || !wait || triedSubscribe {
			return
		}
		triedSubscribe = true
		s, err := n.Subscribe(ctx, m.name)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("dlock: release notifications unavailable, polling", "backend", c.backend, "name", m.name, "err", err)
			}
			return
		}
		sub, notify = s, s.C()
	}
	bo := newBackoff(r.waitMin, r.waitMax)
	for {
		sent := time.Now()
		g, err := c.d.TryAcquire(ctx, req)
		if err == nil && g.Token == 0 {
			err = errZeroToken
		}
		if t != nil {
			t.attempt(err, time.Since(sent))
		}
		if err == errZeroToken {
			return driver.Grant{}, sent, err
		}
		if err == nil {
			return g, sent, nil
		}
		if !errors.Is(err, ErrLocked) {
			if !explicitOwner && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrInvalid) {
				// The outcome is unknown: the grant may exist on the server
				// under our fresh owner. Release it so nothing is left behind,
				// and keep trying in the background if that fails too.
				dl := driver.Lease{Name: req.Name, Owner: req.Owner, TTL: req.TTL, LockDelay: req.LockDelay,
					Kind: req.Kind, Permits: req.Permits}
				rctx := c.detached(ctx)
				_, rerr := c.d.Release(rctx, dl)
				rctx.stop()
				if rerr != nil && !errors.Is(rerr, ErrNotHeld) {
					c.releaseUnknown("clean-up", dl, nil, true, rerr)
				}
			}
			return driver.Grant{}, sent, err
		}
		if !wait {
			return driver.Grant{}, sent, err
		}
		if ctx = cw.arm(c); ctx == nil {
			return driver.Grant{}, sent, ErrClosed
		}
		if ctx.Err() != nil {
			// The attempt outlasted ctx: no further attempt (the retry
			// after subscribing included) may start on it.
			return driver.Grant{}, sent, ctx.Err()
		}
		if !triedSubscribe {
			if subscribe(); notify != nil {
				continue // try again now that a release cannot be missed
			}
		}
		d := bo.next()
		// Never wait past the moment the holder's lease (plus delay) runs
		// out; with notifications, wait for them rather than poll.
		var le *driver.LockedError
		if errors.As(err, &le) && le.RetryAfter > 0 {
			if notify != nil && le.Token != 0 {
				// Notified backends only need the poll for expiry, which
				// the holder's remaining time bounds.
				d = le.RetryAfter + time.Millisecond
			} else if notify != nil {
				// A holder of unknown token may not be a dlock client (a
				// foreign key on Redis): its release is not notified, so
				// poll at the wait ceiling as well as at its expiry.
				d = min(le.RetryAfter+time.Millisecond, r.waitMax)
			} else if le.RetryAfter+time.Millisecond < d {
				d = le.RetryAfter + time.Millisecond
			}
		} else if notify != nil {
			d = r.waitMax
		}
		if req.Waiting && req.Kind == driver.Write {
			// A waiting writer's mark lives about one TTL from its last
			// refused attempt: retry often enough to keep it fresh.
			d = min(d, max(r.ttl/3, time.Millisecond))
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return driver.Grant{}, sent, ctx.Err()
		case <-notify:
			t.Stop()
		case <-t.C:
		}
	}
}

// backoff draws the waits between attempts: full jitter, each wait uniform
// over [lo, ceiling], the ceiling doubling from lo up to hi.
type backoff struct{ lo, hi, ceiling time.Duration }

func newBackoff(lo, hi time.Duration) backoff {
	return backoff{lo: lo, hi: hi, ceiling: lo}
}

// next returns the next wait and raises the ceiling.
func (b *backoff) next() time.Duration {
	d := b.lo
	if b.ceiling > b.lo {
		d += rand.N(b.ceiling - b.lo + 1)
	}
	b.ceiling = min(b.ceiling*2, b.hi)
	return d
}

// queued is one Acquire of a driver.Queuer, sent at sent.
func queued(ctx context.Context, q driver.Queuer, req driver.AcquireRequest, t *opTrace) (g driver.Grant, sent time.Time, err error) {
	sent = time.Now()
	g, err = q.Acquire(ctx, req)
	if err == nil && g.Token == 0 {
		err = errZeroToken
	}
	if t != nil {
		t.attempt(err, time.Since(sent))
	}
	return g, sent, err
}

// queuer returns the driver as a driver.Queuer when it queues req (see
// driver.QueueChooser), or nil: the waiting Lock then loops over
// TryAcquire.
func (c *Client) queuer(req driver.AcquireRequest) driver.Queuer {
	q, ok := c.d.(driver.Queuer)
	if !ok {
		return nil
	}
	if qc, ok := c.d.(driver.QueueChooser); ok && !qc.Queues(req) {
		return nil
	}
	return q
}
