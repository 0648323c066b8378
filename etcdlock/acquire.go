package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sessionlock"
)

// TryAcquire implements driver.Driver: one transaction that enqueues the
// request and reads the head of the queue; when the request is not at the
// head its key is deleted again and a *driver.LockedError returned.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.acquire(ctx, req, false)
}

// Acquire implements driver.Queuer: it enqueues the request and waits, watching
// only the key just before its own, until it reaches the head of the queue.
// On any error, including ctx being done or the lease ending while waiting, it
// deletes its key before returning.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.acquire(ctx, req, true)
}

func (d *Driver) acquire(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	ctx = rpcCtx(ctx)
	// start is when this call began; grants report their validity from the
	// last refresh of the lease (Grant.Sent), which may be later.
	start := time.Now()
	ops := sessionlock.Ops[*handle]{
		Enqueue: func() (driver.Grant, error) { return d.enqueue(ctx, req, wait, start, nil) },
		Again:   func(prev *handle) (driver.Grant, error) { return d.enqueue(ctx, req, wait, start, prev) },
		Check:   func(hd *handle) (bool, time.Time, error) { return d.stillHeld(ctx, hd) },
		Grant:   d.grant,
	}
	if req.LockDelay > 0 {
		ops.Reenter = func(hd *handle) error { return d.setGuard(ctx, hd, req.LockDelay) }
	}
	if req.Kind != driver.Exclusive {
		ops.Enqueue = func() (driver.Grant, error) { return d.enqueueKind(ctx, req, wait) }
		ops.Again = nil
	}
	return d.holds.Acquire(ctx, sessionlock.HoldName(req.Kind, req.Name), req.Owner, wait, "etcdlock: acquire", ops)
}

// grant describes h. The lease was refreshed by a request sent at sent, so
// it lasts at least its TTL from then.
func (d *Driver) grant(h *handle, count int, sent time.Time) driver.Grant {
	h.confirmed.Record(sent)
	return driver.Grant{
		Token:  uint64(cmp.Or(h.token, h.rev)),
		Count:  count,
		TTL:    h.sess.ttl,
		Sent:   sent,
		Key:    h.key,
		Handle: h,
		Lost:   h.sess.Done(),
		Cause:  h.sess.CauseFunc(),
	}
}

// stillHeld reports whether h's key exists with h's create revision, and
// when the lease was last known to be refreshed (see commitRefreshed).
//
// The check is a linearizable read of the key. It must not be a transaction
// without operations (only a comparison): etcd serves such a transaction as
// a serializable read, from whichever member the client asked, so a member
// that had not yet applied the grant's put reported it gone (a re-entry
// right after the grant then queued behind its own key: ErrLocked), and a
// member cut off from the quorum would confirm a grant that is gone.
func (d *Driver) stillHeld(ctx context.Context, h *handle) (bool, time.Time, error) {
	if h.sess.Lost() {
		return false, time.Time{}, nil
	}
	resp, err := d.cli.Get(ctx, h.key, clientv3.WithKeysOnly())
	sent := h.sess.RefreshedAt()
	if err != nil {
		if h.sess.Lost() {
			return false, sent, nil
		}
		return false, sent, fmt.Errorf("etcdlock: check key: %w", err)
	}
	ok := present(resp.Kvs, h.rev)
	if d.testCheck != nil {
		ok = d.testCheck(h, ok)
	}
	return ok, sent, nil
}

// commitRefreshed commits txn (bound to its own context) and returns, with
// its outcome, the send time of the last keepalive of sess's lease that the
// server confirmed: the lease lasts at least its TTL from then.
func commitRefreshed(sess *session, txn clientv3.Txn) (*clientv3.TxnResponse, time.Time, error) {
	resp, err := txn.Commit()
	return resp, sess.RefreshedAt(), err
}

// enqueue puts the request's key and, when wait is set, waits for its turn.
//
// prev, when not nil, is the grant of the same (name, owner) that a re-entry
// check reported gone. If prev's key still heads the queue on prev's lease,
// which is this request's lease, the check was wrong: the new key (at a
// higher slot, since prev's slot is still in use) is removed and prev's
// grant returned, so the re-entry counts it once more instead of queueing
// behind its own grant.
func (d *Driver) enqueue(ctx context.Context, req driver.AcquireRequest, wait bool, start time.Time, prev *handle) (driver.Grant, error) {
	secs, err := d.leaseSeconds(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	sess, err := d.session(ctx, secs)
	if err != nil {
		return driver.Grant{}, err
	}
	var delayLease clientv3.LeaseID
	if req.LockDelay > 0 {
		if delayLease, err = d.delayLease(ctx, sess, req.LockDelay); err != nil {
			return driver.Grant{}, err
		}
	}
	h := d.newHandle(driver.Exclusive, req.Name, sess)
	pfx := d.queuePrefix(req.Name)
	guard := d.guardKey(req.Name)
	absent := clientv3.Compare(clientv3.CreateRevision(h.key), "=", 0)
	look := []clientv3.Op{clientv3.OpPut(h.key, req.Owner, clientv3.WithLease(sess.id)),
		clientv3.OpGet(pfx, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...),
		clientv3.OpGet(guard)}
	txn := d.cli.Txn(ctx)
	if delayLease != 0 {
		// With a lock-delay, a free lock (no key under the queue prefix,
		// no guard) is taken with its guard in one transaction; otherwise
		// the nested transaction is the plain enqueue, and the guard is
		// written once the lock is granted (setGuard). Set first: a
		// discard must delete the guard even if this write's reply is lost.
		h.delay.Store(int64(req.LockDelay))
		txn = txn.If(absent,
			clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(guard), "=", 0)).
			Then(look[0], clientv3.OpPut(guard, h.key, clientv3.WithLease(delayLease))).
			Else(clientv3.OpTxn([]clientv3.Cmp{absent}, look, nil))
	} else {
		txn = txn.If(absent).Then(look...)
	}
	resp, sent, err := commitRefreshed(sess, txn)
	if err != nil {
		// The put may have happened: remove it (and the guard). The slot is
		// this attempt's alone until then, so whatever is there is ours.
		d.discardGuarded(h)
		return driver.Grant{}, ctxerr.Wrap(ctx, "etcdlock: enqueue", err)
	}
	h.rev = resp.Header.Revision
	rev := h.rev
	if delayLease != 0 && resp.Succeeded {
		// Free, and taken with its guard.
		g := d.grant(h, 1, sent)
		sess.track(h)
		return g, nil
	}
	ok, rs := resp.Succeeded, resp.Responses
	if delayLease != 0 {
		h.delay.Store(0) // no guard was written
		inner := resp.Responses[0].GetResponseTxn()
		ok, rs = inner.GetSucceeded(), inner.GetResponses()
	}
	if !ok {
		// The key names this driver's lease and a slot not in use: it can
		// only be the put of an earlier attempt whose outcome was unknown
		// and that reached the server after its discard looked. Remove it.
		d.discard(h, 0)
		return driver.Grant{}, fmt.Errorf("etcdlock: key %q exists already (a late put of an earlier attempt; removed)", h.key)
	}
	head := rs[1].GetResponseRange().Kvs
	if prev != nil && prev.sess == sess && len(head) > 0 && string(head[0].Key) == prev.key && head[0].CreateRevision == prev.rev {
		d.discard(h, rev)
		return d.grant(prev, 1, sent), nil
	}
	first := len(head) == 0 || head[0].CreateRevision == rev
	if !first && !inQueue(pfx, head[0].Key) {
		// The oldest key is a nested name's ("a/b" under "a/"): look
		// past those.
		pred, own, err := d.scanQueue(ctx, pfx, h)
		switch {
		case err != nil:
			d.discard(h, rev)
			return driver.Grant{}, ctxerr.Wrap(ctx, "etcdlock: enqueue", err)
		case !own:
			d.discard(h, rev)
			return driver.Grant{}, fmt.Errorf("etcdlock: queue key %q was deleted as it was put: %w", h.key, driver.ErrSessionLost)
		}
		first = pred == nil
	}
	if !first || blocked(rs[2].GetResponseRange().Kvs, h.key) {
		if !wait {
			d.discard(h, rev)
			return driver.Grant{}, &driver.LockedError{}
		}
		if sent, err = d.waitTurn(ctx, h, pfx, guard); err != nil {
			d.discard(h, rev)
			return driver.Grant{}, err
		}
	}
	if req.LockDelay > 0 {
		if err := d.setGuard(ctx, h, req.LockDelay); err != nil {
			d.discardGuarded(h) // the guard may have been written
			return driver.Grant{}, err
		}
	}
	g := d.grant(h, 1, sent)
	sess.track(h)
	return g, nil
}

// waitTurn waits until no key older than h's remains under pfx and no
// lock-delay guard of an earlier holder remains. It returns the refresh time
// of the lease as of the look that found the way clear.
func (d *Driver) waitTurn(ctx context.Context, h *handle, pfx, guard string) (time.Time, error) {
	for {
		resp, sent, err := commitRefreshed(h.sess, d.cli.Txn(ctx).Then(
			clientv3.OpGet(h.key, clientv3.WithKeysOnly()),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(h.rev-1), clientv3.WithKeysOnly())...),
			clientv3.OpGet(guard),
		))
		if err != nil {
			if h.sess.Lost() {
				return sent, fmt.Errorf("etcdlock: while waiting: %w", h.sess.Cause())
			}
			return sent, ctxerr.Wrap(ctx, "etcdlock: wait", err)
		}
		own := resp.Responses[0].GetResponseRange().Kvs
		if len(own) == 0 || own[0].CreateRevision != h.rev {
			if h.sess.Lost() {
				return sent, fmt.Errorf("etcdlock: while waiting: %w", h.sess.Cause())
			}
			return sent, fmt.Errorf("etcdlock: queue key %q was deleted while waiting: %w", h.key, driver.ErrSessionLost)
		}
		prev := resp.Responses[1].GetResponseRange().Kvs
		g := resp.Responses[2].GetResponseRange().Kvs
		if len(prev) > 0 && !inQueue(pfx, prev[0].Key) {
			// A nested name's key ("a/b" under "a/"): look past those.
			pred, own, err := d.scanQueue(ctx, pfx, h)
			switch {
			case err != nil:
				return sent, ctxerr.Wrap(ctx, "etcdlock: wait", err)
			case !own:
				continue // the read above says why
			}
			prev = prev[:0]
			if pred != nil {
				prev = append(prev, pred)
			}
		}
		var next *mvccpb.KeyValue
		switch {
		case len(prev) > 0:
			next = prev[0]
		case blocked(g, h.key):
			next = g[0] // an earlier holder was lost: wait out its lock-delay
		default:
			return sent, nil
		}
		if err := d.waitDelete(ctx, h.sess, string(next.Key), next.CreateRevision); err != nil {
			return sent, err
		}
	}
}

// scanQueue reads every key under pfx, h's queue prefix, and returns the
// queue key just before h's (nil when h's is first) and whether h's key is
// still there. Only a queue whose prefix also holds keys of nested names
// needs it: the common case reads the one key it needs in the acquire's or
// wait's transaction.
func (d *Driver) scanQueue(ctx context.Context, pfx string, h *handle) (pred *mvccpb.KeyValue, own bool, err error) {
	resp, err := d.cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, false, err
	}
	for _, kv := range resp.Kvs {
		switch {
		case string(kv.Key) == h.key:
			return pred, kv.CreateRevision == h.rev, nil
		case inQueue(pfx, kv.Key):
			pred = kv
		}
	}
	return nil, false, nil
}

// waitDelete waits until the key created at revision createRev is gone.
//
// The watch starts at the current revision rather than at the revision of
// the caller's last read: etcd serves a watch that starts in the past from a
// background loop that catches up every 100ms, which would add up to 100ms to
// every hand-off on a busy lock. Once the watch exists, one read makes sure
// the key was not deleted before it.
func (d *Driver) waitDelete(ctx context.Context, sess *session, key string, createRev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.cli.Watch(wctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return fmt.Errorf("etcdlock: wait: %w", ctx.Err())
				}
				if d.ctx.Err() != nil {
					return errors.New("etcdlock: driver is closed")
				}
				return nil // the watch ended: look again
			}
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					return nil // look again
				}
				return fmt.Errorf("etcdlock: watch %q: %w", key, err)
			}
			if wr.Created {
				resp, err := d.cli.Get(ctx, key, clientv3.WithKeysOnly())
				if err != nil {
					return ctxerr.Wrap(ctx, "etcdlock: wait", err)
				}
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != createRev {
					return nil
				}
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		case <-sess.Done():
			return fmt.Errorf("etcdlock: while waiting: %w", sess.Cause())
		case <-ctx.Done():
			return fmt.Errorf("etcdlock: wait: %w", ctx.Err())
		case <-d.ctx.Done():
			return errors.New("etcdlock: driver is closed")
		}
	}
}

// discard deletes h's key, bound to h's lease, if its create revision is rev
// (or whatever version is there when rev is 0: a slot is one acquire
// attempt's alone until its key is known gone, so that is the failed
// attempt's own), on a detached context, and then frees h's slot. When that
// fails it keeps trying in the background while the lease lives, so an error
// path never leaves a live key blocking the queue.
func (d *Driver) discard(h *handle, rev int64) {
	if d.tryDiscard(h.key, rev) == nil {
		h.sess.freeSlot(h)
		return
	}
	d.retryInBackground(h, func() error { return d.tryDiscard(h.key, rev) }, func() { h.sess.freeSlot(h) })
}

// retryInBackground calls try again, on a backoff from 50ms to 2s, until it
// succeeds (then done runs), h's session is lost (its keys and delay leases
// went with it, its slots too) or the driver closes.
func (d *Driver) retryInBackground(h *handle, try func() error, done func()) {
	d.bg.Go(func() {
		delay := 50 * time.Millisecond
		for {
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(delay):
			}
			if h.sess.Lost() {
				return
			}
			if try() == nil {
				if done != nil {
					done()
				}
				return
			}
			delay = min(2*delay, 2*time.Second)
		}
	})
}

func (d *Driver) tryDiscard(key string, rev int64) error {
	ctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
	defer cancel()
	ctx = rpcCtx(ctx)
	if rev == 0 {
		resp, err := d.cli.Get(ctx, key, clientv3.WithKeysOnly())
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		rev = resp.Kvs[0].CreateRevision
	}
	_, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
	return err
}
