package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

var (
	_ driver.Kinder        = (*Driver)(nil)
	_ driver.Withdrawer    = (*Driver)(nil)
	_ driver.MultiAcquirer = (*Driver)(nil)
)

// SupportsKind reports true for every kind: mutexes, both sides of
// read/write locks, and semaphore permits (driver.Kinder); in LayoutPlain
// for mutexes only.
func (d *Driver) SupportsKind(k driver.Kind) bool {
	if d.plain {
		return k == driver.Exclusive
	}
	return redisscript.CheckKind(k) == nil
}

// plainKind refuses a read, write or permit request in LayoutPlain.
func (d *Driver) plainKind(k driver.Kind) error {
	if d.plain {
		return fmt.Errorf("redislock: a %v lock with layout=plain (foreign clients have none to share; use the dlock layout): %w", k, driver.ErrUnsupported)
	}
	return nil
}

// tryKind runs the acquire script of a read, write or permit request once.
// A refused waiting Write leaves its waiting writer mark for req.TTL.
func (d *Driver) tryKind(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := redisscript.CheckKind(req.Kind); err != nil {
		return driver.Grant{}, fmt.Errorf("redislock: acquire: %w", err)
	}
	if err := d.plainKind(req.Kind); err != nil {
		return driver.Grant{}, err
	}
	if req.Kind == driver.Permit && req.Permits < 1 {
		return driver.Grant{}, fmt.Errorf("redislock: acquire %q: permit count %d is below 1: %w", req.Name, req.Permits, driver.ErrInvalid)
	}
	if !d.gate.Enter() {
		return driver.Grant{}, errClosed
	}
	defer d.gate.Exit()
	kk := redisscript.KindKeysFor(d.prefix, req.Name, req.Kind)
	var mark time.Duration
	if req.Kind == driver.Write && req.Waiting {
		mark = req.TTL
	}
	c, done := d.conn()
	defer done()
	sent := time.Now()
	r, err := redisscript.AcquireKind(ctx, c, kk, req, mark)
	if err != nil {
		d.grants.GrantedKind(kk, req.Owner, req.TTL, sent)
		return driver.Grant{}, ctxerr.Wrap(ctx, "redislock: acquire", err)
	}
	if r.StoredPermits != 0 {
		return driver.Grant{}, fmt.Errorf("redislock: semaphore %q has %d permits while in use, the request asks for %d: %w", req.Name, r.StoredPermits, req.Permits, driver.ErrInvalid)
	}
	if !r.Granted {
		return driver.Grant{}, &driver.LockedError{RetryAfter: r.PTTL, Token: r.Fence}
	}
	d.grants.GrantedKind(kk, req.Owner, req.TTL, sent)
	if err := d.replicated(ctx, c); err != nil {
		d.undo(ctx, func(ctx context.Context, c redis.UniversalClient) {
			if _, held, rerr := redisscript.ReleaseKind(ctx, c, kk, req.Owner, r.Fence); rerr == nil {
				d.grants.Released(kk.ID(), req.Owner, held)
			}
		})
		return driver.Grant{}, ctxerr.Wrap(ctx, "redislock: acquire: granted, then released", err)
	}
	if d.gate.Stopped() {
		return driver.Grant{}, fmt.Errorf("redislock: acquire: granted while closing, released by Close: %w", dlock.ErrClosed)
	}
	return driver.Grant{Token: r.Fence, Count: r.Count, Sent: sent, Key: grantKey(kk), Handle: &kk}, nil
}

// kindKeys returns the keys of a kind grant from its handle, or from name.
func (d *Driver) kindKeys(l driver.Lease) redisscript.KindKeys {
	if kk, ok := l.Handle.(*redisscript.KindKeys); ok && kk != nil && kk.Kind == l.Kind {
		return *kk
	}
	return redisscript.KindKeysFor(d.prefix, l.Name, l.Kind)
}

// releaseKind gives up one hold of a read, write or permit grant.
func (d *Driver) releaseKind(ctx context.Context, l driver.Lease) (int, error) {
	if err := redisscript.CheckKind(l.Kind); err != nil {
		return 0, fmt.Errorf("redislock: release: %w", err)
	}
	kk := d.kindKeys(l)
	remaining, held, err := redisscript.ReleaseKind(ctx, d.client, kk, l.Owner, l.Token)
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "redislock: release", err)
	}
	d.grants.Released(kk.ID(), l.Owner, held)
	if !held {
		return 0, driver.ErrNotHeld
	}
	return remaining, nil
}

// acquireKind is Acquire for a read, write or permit request: TryAcquire
// again whenever a release of the name is published, when the refusal's
// RetryAfter has passed, and at least every TTL/3 (which keeps a waiting
// writer's mark alive). A Write leaves its waiting writer mark while it
// waits, and withdraws it when it gives up.
func (d *Driver) acquireKind(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := d.plainKind(req.Kind); err != nil {
		return driver.Grant{}, err
	}
	req.Waiting = true
	sig := make(chan struct{}, 1)
	var sub *redisscript.Sub
	defer func() {
		if sub != nil {
			sub.Close(false)
		}
	}()
	giveUp := func() {
		if req.Kind == driver.Write {
			d.detached(ctx, func(ctx context.Context) { _ = d.Withdraw(ctx, req) })
		}
	}
	for attempts := 0; ; attempts++ {
		g, err := d.tryKind(ctx, req)
		if err == nil {
			return g, nil
		}
		var le *driver.LockedError
		if !errors.As(err, &le) {
			if attempts > 0 && !errors.Is(err, dlock.ErrClosed) && !errors.Is(err, driver.ErrInvalid) {
				// Refused before, so any hold of this owner is this
				// attempt's own grant, if the script ran: release it.
				d.detached(ctx, func(ctx context.Context) {
					_, _ = d.releaseKind(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Kind: req.Kind, Permits: req.Permits})
				})
			}
			giveUp()
			return driver.Grant{}, err
		}
		if sub == nil {
			if s, err := d.hub.Subscribe(ctx, redisscript.KeysFor(d.prefix, req.Name).Channel, sig); err == nil {
				sub = s
				continue // a release before the subscription is not missed
			}
		}
		wait := max(req.TTL/3, time.Millisecond)
		if le.RetryAfter > 0 && le.RetryAfter+time.Millisecond < wait {
			wait = le.RetryAfter + time.Millisecond
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			giveUp()
			return driver.Grant{}, ctxerr.Wrap(ctx, "redislock: acquire", ctx.Err())
		case <-d.stop:
			t.Stop()
			return driver.Grant{}, errClosed
		case <-sig:
			t.Stop()
		case <-t.C:
		}
	}
}

// Withdraw removes req.Owner's waiting writer mark from the read/write lock
// of req.Name (driver.Withdrawer), in one script call; when it was the last
// mark, the readers it held back are woken. Other kinds have no marks: it
// does nothing for them. It never affects a grant. After Close has begun it
// fails with an error wrapping dlock.ErrClosed.
func (d *Driver) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	if req.Kind != driver.Write {
		return nil
	}
	if !d.gate.Enter() {
		return errClosed
	}
	defer d.gate.Exit()
	if err := redisscript.Withdraw(ctx, d.client, redisscript.KindKeysFor(d.prefix, req.Name, driver.Write), req.Owner); err != nil {
		return ctxerr.Wrap(ctx, "redislock: withdraw", err)
	}
	return nil
}

// TryAcquireMulti takes the mutexes of every request (the keys NewMutex
// uses), all of one owner, in one script call, or none of them
// (driver.MultiAcquirer). Each name is refused as TryAcquire would refuse
// it (another holder, a lock-delay, a key dlock did not write, a live
// waiter queued first); the first refusing name's *driver.LockedError is
// returned and nothing is taken. Names whose keys are in different Redis
// Cluster hash slots (on a cluster, different names almost always are:
// each name is its own hash tag), or several names on a redis.Ring, cannot
// be taken by one script: the error then wraps driver.ErrUnsupported, with
// nothing taken. With Options.MinReplicas, grants fewer replicas
// acknowledged in time are all released and the error wraps
// ErrNotReplicated. After Close has begun it fails with an error wrapping
// dlock.ErrClosed.
func (d *Driver) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	owner, ttl, delay := reqs[0].Owner, reqs[0].TTL, reqs[0].LockDelay
	for _, r := range reqs {
		if r.Kind != driver.Exclusive || r.Owner != owner || r.TTL != ttl || r.LockDelay != delay {
			return nil, fmt.Errorf("redislock: multi-acquire: every request must be a mutex of one owner, TTL and lock-delay: %w", driver.ErrInvalid)
		}
	}
	if _, ring := d.client.(*redis.Ring); ring && len(reqs) > 1 {
		return nil, fmt.Errorf("redislock: multi-acquire over a redis.Ring: %w", driver.ErrUnsupported)
	}
	if !d.gate.Enter() {
		return nil, errClosed
	}
	defer d.gate.Exit()
	ks := make([]redisscript.Keys, len(reqs))
	for i, r := range reqs {
		k, err := d.mutexKeys(r.Name)
		if err != nil {
			return nil, err
		}
		ks[i] = k
	}
	c, done := d.conn()
	defer done()
	sent := time.Now()
	r, err := redisscript.AcquireMulti(ctx, c, ks, owner, ttl, delay)
	if errors.Is(err, redisscript.ErrCrossSlot) {
		return nil, fmt.Errorf("redislock: multi-acquire: %w: %w", err, driver.ErrUnsupported)
	}
	if err != nil {
		for _, k := range ks {
			d.grants.Granted(k, owner, ttl, sent)
		}
		return nil, ctxerr.Wrap(ctx, "redislock: multi-acquire", err)
	}
	if r.Granted == nil {
		return nil, &driver.LockedError{RetryAfter: r.Refusal.PTTL, Token: r.Refusal.Fence}
	}
	gs := make([]driver.Grant, len(reqs))
	for i, a := range r.Granted {
		d.grants.Granted(ks[i], owner, ttl, sent)
		gs[i] = driver.Grant{Token: a.Fence, Count: a.Count, Sent: sent, Key: ks[i].Lock, Handle: &ks[i]}
	}
	if err := d.replicated(ctx, c); err != nil {
		d.undo(ctx, func(ctx context.Context, c redis.UniversalClient) {
			for i, k := range ks {
				if _, held, rerr := d.releaseMutex(ctx, c, k, owner, gs[i].Token); rerr == nil {
					d.grants.Released(k.Lock, owner, held)
				}
			}
		})
		return nil, ctxerr.Wrap(ctx, "redislock: multi-acquire: granted, then released", err)
	}
	if d.gate.Stopped() {
		return nil, fmt.Errorf("redislock: multi-acquire: granted while closing, released by Close: %w", dlock.ErrClosed)
	}
	return gs, nil
}

// grantKey is the key a grant of kk lives in, for Grant.Key: a writer's (or
// a mutex's) key, or the set of read or permit holders.
func grantKey(kk redisscript.KindKeys) string {
	if kk.Kind == driver.Read || kk.Kind == driver.Permit {
		return kk.Holders
	}
	return kk.Writer
}
