package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	c    *Client
	name string
	opts MutexOptions
	err  error // construction error, reported on use
	r    resolved
}

// NewMutex returns the lock called name. opts may be nil for the client's
// defaults.
func (c *Client) NewMutex(name string, opts *MutexOptions) *Mutex {
	m := &Mutex{c: c, name: name}
	if opts != nil {
		m.opts = *opts
	}
	if err := checkName(name, c.d); err != nil {
		m.err = err
		return m
	}
	m.r, m.err = c.resolve(opts)
	return m
}

// Name returns the lock's name.
func (m *Mutex) Name() string { return m.name }

// Lock takes the lock, waiting while someone else holds it. Waiters are
// woken by the backend on release where it can (Redis pub/sub, PostgreSQL
// NOTIFY, etcd and ZooKeeper watches on the predecessor); otherwise Lock
// retries with jittered exponential backoff, never sleeping past the moment
// the holder's lease runs out.
//
// Lock returns when the lock is granted, when ctx is done (the error then
// wraps ctx.Err(), and nothing is left behind on the server), when the client
// is closed (ErrClosed), or on a backend error (*OpError).
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	return m.acquire(ctx, true)
}

// TryLock makes one attempt to take the lock. It returns an error wrapping
// ErrLocked at once if someone else holds it or it is inside a lock-delay.
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	return m.acquire(ctx, false)
}

func (m *Mutex) acquire(ctx context.Context, wait bool) (*Lease, error) {
	if m.err != nil {
		return nil, m.err
	}
	if ctx == nil {
		return nil, invalid("ctx", "must not be nil")
	}
	c := m.c
	if c.isClosed() {
		return nil, ErrClosed
	}
	r := m.r
	explicitOwner := r.owner != ""
	if !explicitOwner {
		r.owner = newOwner()
	}
	req := driver.AcquireRequest{Name: m.name, Owner: r.owner, TTL: r.ttl, LockDelay: r.delay}
	op := "trylock"
	if wait {
		op = "lock"
	}
	if wait {
		// Stop waiting when the client closes.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(c.closeCtx, func() { cancel(ErrClosed) })
		defer stop()
	}

	var (
		g    driver.Grant
		sent time.Time
		err  error
	)
	if q, ok := c.d.(driver.Queuer); ok && wait {
		sent = c.opts.Clock.Now()
		g, err = q.Acquire(ctx, req)
	} else {
		g, sent, err = m.tryLoop(ctx, req, r, wait, explicitOwner)
	}
	if err != nil {
		if context.Cause(ctx) == ErrClosed {
			return nil, ErrClosed
		}
		if errors.Is(err, ErrLocked) {
			return nil, fmt.Errorf("dlock: %s %q: %w", op, m.name, err)
		}
		return nil, c.wrap(op, m.name, ctx, err)
	}
	if !g.Sent.IsZero() && g.Sent.After(sent) {
		sent = g.Sent
	}
	l := newLease(c, m, r, g, sent, ctx)
	if l.ValidFor() == 0 {
		// The grant arrived after its own validity deadline (a very slow
		// reply, or this process was paused): it cannot be relied on.
		rctx, rcancel := c.detached(ctx)
		_, _ = c.d.Release(rctx, l.driverLease())
		rcancel()
		l.end(&lostError{cause: errors.New("granted after its validity deadline")})
		return nil, &OpError{Op: op, Name: m.name, Err: fmt.Errorf("the grant arrived after its validity deadline (TTL %v); the lock was released", l.ttl)}
	}
	if !c.register(l, g.Lost) {
		rctx, rcancel := c.detached(ctx)
		_, _ = c.d.Release(rctx, l.driverLease())
		rcancel()
		l.end(ErrClosed)
		return nil, ErrClosed
	}
	c.renew.poke()
	return l, nil
}

// tryLoop calls TryAcquire until it succeeds, fails for a reason other than
// ErrLocked, or (when wait is false) after the first attempt.
func (m *Mutex) tryLoop(ctx context.Context, req driver.AcquireRequest, r resolved, wait, explicitOwner bool) (driver.Grant, time.Time, error) {
	var sub driver.Subscription
	defer func() {
		if sub != nil {
			_ = sub.Close()
		}
	}()
	c := m.c
	clock := c.opts.Clock
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
				c.log.Warn("dlock: release notifications unavailable, polling", "name", m.name, "err", err)
			}
			return
		}
		sub, notify = s, s.C()
	}
	backoff := r.waitMin
	for attempt := 0; ; attempt++ {
		sent := clock.Now()
		g, err := c.d.TryAcquire(ctx, req)
		if err == nil {
			if g.Token == 0 {
				return driver.Grant{}, sent, errors.New("driver granted a lock with fencing token 0")
			}
			return g, sent, nil
		}
		if !errors.Is(err, ErrLocked) {
			if !explicitOwner && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrInvalid) {
				// The outcome is unknown: the grant may exist on the server
				// under our fresh owner. Release it so nothing is left behind.
				rctx, cancel := c.detached(ctx)
				_, _ = c.d.Release(rctx, driver.Lease{Name: req.Name, Owner: req.Owner, TTL: req.TTL, LockDelay: req.LockDelay})
				cancel()
			}
			return driver.Grant{}, sent, err
		}
		if !wait {
			return driver.Grant{}, sent, err
		}
		if !triedSubscribe {
			if subscribe(); notify != nil {
				continue // try again now that a release cannot be missed
			}
		}
		// Full jitter over [waitMin, backoff], backoff doubling to waitMax,
		// never past the moment the holder's lease (plus delay) runs out.
		d := r.waitMin
		if backoff > r.waitMin {
			d += rand.N(backoff - r.waitMin + 1)
		}
		backoff = min(backoff*2, r.waitMax)
		var le *driver.LockedError
		if errors.As(err, &le) && le.RetryAfter > 0 {
			if notify != nil {
				// Notified backends only need the poll for expiry, which
				// the holder's remaining time bounds.
				d = le.RetryAfter + time.Millisecond
			} else if le.RetryAfter+time.Millisecond < d {
				d = le.RetryAfter + time.Millisecond
			}
		} else if notify != nil {
			d = r.waitMax
		}
		t := clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return driver.Grant{}, sent, ctx.Err()
		case <-notify:
			t.Stop()
		case <-t.C():
		}
	}
}
