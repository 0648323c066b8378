package redlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

var (
	_ driver.Kinder     = (*Driver)(nil)
	_ driver.Withdrawer = (*Driver)(nil)
)

// SupportsKind reports true for mutexes and both sides of read/write locks
// (driver.Kinder), and false for semaphore permits.
//
// A read/write lock keeps Redlock's majority rule: a reader and a writer
// each need a quorum of nodes, any two quorums share a node, and on that
// node the scripts never let a reader and a writer (or two writers) hold
// at once. A semaphore cannot be made safe that way: with every node
// admitting up to P holders and each holder needing a quorum q of N nodes,
// up to ⌊P·N/q⌋ holders can each hold a quorum at once (3 holders of a
// 2-permit semaphore on 3 nodes: {0,1}, {1,2}, {0,2}). Permits would have
// to be P separate Redlock mutexes (slots) instead, which this driver does
// not implement.
func (d *Driver) SupportsKind(k driver.Kind) bool {
	return k == driver.Exclusive || k == driver.Read || k == driver.Write
}

// lockOps are one lock's per-node operations (a mutex, or one side of a
// read/write lock), so that one Redlock acquire, undo, fence write-back and
// release serve every kind. They are plain data with methods, not closures:
// an uncontended Lock+Unlock builds them twice, and closures each capturing
// the keys and the request cost ≈1 KB of heap per Lock+Unlock.
type lockOps struct {
	keys redisscript.Keys      // a mutex's keys (Exclusive)
	ref  *redisscript.Ref      // the same, in the compact form a grant keeps (nil for a kind)
	kind *redisscript.KindKeys // a kind's keys (nil for a mutex)
	id   string                // the grant's key in the driver's book
	req  driver.AcquireRequest // Owner, TTL and LockDelay (and a kind's request)
	// score, if not zero, is a queued mutex waiter's (see queued).
	score int64
	// grants, if not nil, are a queued mutex waiter's grants (see
	// grant.go): its refused attempts ask for grants on grantCh and are
	// recorded there.
	grants  *grantState
	grantCh string
	// markTTL, if not zero, is how long a waiting writer's mark lasts (see
	// hasMark).
	markTTL time.Duration
}

// opsFor returns the operations of req's lock.
func (d *Driver) opsFor(req driver.AcquireRequest) lockOps {
	if req.Kind == driver.Exclusive {
		return d.mutexOps(redisscript.RefFor(d.prefix, req.Name), req)
	}
	return d.kindOps(redisscript.KindKeysFor(d.prefix, req.Name, req.Kind), req)
}

// opsForLease returns the operations of l's lock, from its handle when it
// has one.
func (d *Driver) opsForLease(l driver.Lease) lockOps {
	req := driver.AcquireRequest{Name: l.Name, Owner: l.Owner, TTL: l.TTL, LockDelay: l.LockDelay, Kind: l.Kind, Permits: l.Permits}
	h, _ := l.Handle.(*handle)
	if l.Kind == driver.Exclusive {
		if h != nil && h.ref != nil {
			return d.mutexOpsRef(h.ref, req)
		}
		return d.mutexOps(redisscript.RefFor(d.prefix, l.Name), req)
	}
	if h != nil && h.kind != nil && h.kind.Kind == l.Kind {
		return d.kindOps(*h.kind, req)
	}
	return d.kindOps(redisscript.KindKeysFor(d.prefix, l.Name, l.Kind), req)
}

// mutexOps are the operations of the mutex whose keys r holds.
func (d *Driver) mutexOps(r redisscript.Ref, req driver.AcquireRequest) lockOps {
	return d.mutexOpsRef(&r, req)
}

// mutexOpsRef are the operations of the mutex whose keys ref holds; a
// grant's handle and the book of grants keep ref itself (which must not
// change).
func (d *Driver) mutexOpsRef(ref *redisscript.Ref, req driver.AcquireRequest) lockOps {
	k := ref.Keys()
	return lockOps{keys: k, ref: ref, id: k.Lock, req: req}
}

// queued turns a mutex's ops into those of a waiter queued at score: a
// refusal queues it there (or renews its entry) in the same call, and
// requeue and leave apply.
func (ops *lockOps) queued(score int64) { ops.score = score }

// acquire runs the acquire script on n.
func (ops *lockOps) acquire(ctx context.Context, n *node) (redisscript.AcquireResult, error) {
	switch {
	case ops.kind != nil:
		r, err := redisscript.AcquireKind(ctx, n.client, *ops.kind, ops.req, ops.markTTL)
		return r.AcquireResult, err
	case ops.score != 0 && ops.grants != nil:
		sent := time.Now()
		r, counter, err := acquireWaiting(ctx, n.client, ops.keys, ops.req.Owner, ops.req.TTL, ops.req.LockDelay, ops.score, ops.grantCh)
		switch {
		case err != nil:
		case r.Granted:
			ops.grants.granted(n.i, r.Fence)
		default:
			ops.grants.refused(n.i, sent, counter)
		}
		return r, err
	case ops.score != 0:
		return redisscript.AcquireAtScore(ctx, n.client, ops.keys, ops.req.Owner, ops.req.TTL, ops.req.LockDelay, queueWait, ops.score)
	default:
		return redisscript.Acquire(ctx, n.client, ops.keys, ops.req.Owner, ops.req.TTL, ops.req.LockDelay)
	}
}

// fence raises n's fencing counter (and the holder's token) to token.
func (ops *lockOps) fence(ctx context.Context, n *node, token uint64) error {
	if ops.kind != nil {
		return redisscript.WriteFenceKind(ctx, n.client, *ops.kind, ops.req.Owner, token)
	}
	return redisscript.WriteFence(ctx, n.client, ops.keys, ops.req.Owner, token)
}

// release releases one hold on n; it publishes the release only if
// publish is set.
func (ops *lockOps) release(ctx context.Context, n *node, publish bool) (remaining int, held bool, err error) {
	if ops.kind != nil {
		kk := *ops.kind
		if !publish {
			kk.Channel = ""
		}
		return redisscript.ReleaseKind(ctx, n.client, kk, ops.req.Owner, 0)
	}
	if publish {
		return releaseGranting(ctx, n.client, ops.keys, ops.req.Owner, 0)
	}
	k := ops.keys
	k.Channel = ""
	return redisscript.Release(ctx, n.client, k, ops.req.Owner, 0)
}

// hasMark reports whether the ops are a waiting writer's, which leaves a
// mark on the nodes (see mark).
func (ops *lockOps) hasMark() bool { return ops.markTTL > 0 }

// mark leaves a waiting writer's mark on n.
func (ops *lockOps) mark(ctx context.Context, n *node) error {
	return redisscript.Mark(ctx, n.client, *ops.kind, ops.req.Owner, ops.markTTL)
}

// isQueued reports whether the ops are a queued mutex waiter's, for which
// requeue and leave apply.
func (ops *lockOps) isQueued() bool { return ops.kind == nil && ops.score != 0 }

// requeue puts a queued waiter back in n's queue at its score after an
// undo released n's grant (which took it out).
func (ops *lockOps) requeue(ctx context.Context, n *node) error {
	return redisscript.Enqueue(ctx, n.client, ops.keys, ops.req.Owner, ops.score, queueWait)
}

// leave takes a queued waiter out of n's queue after a quorum granted it.
func (ops *lockOps) leave(ctx context.Context, n *node) error {
	return leaveGranting(ctx, n.client, ops.keys, ops.req.Owner)
}

// book records the grant, started at start, in the driver's book.
func (d *Driver) book(ops *lockOps, start time.Time) {
	if ops.kind != nil {
		d.grants.GrantedKind(*ops.kind, ops.req.Owner, ops.req.TTL, start)
		return
	}
	d.grants.GrantedRef(ops.ref, ops.req.Owner, ops.req.TTL, start)
}

func (d *Driver) kindOps(kk redisscript.KindKeys, req driver.AcquireRequest) lockOps {
	ops := lockOps{kind: &kk, id: kk.ID(), req: req}
	if req.Kind == driver.Write && req.Waiting {
		ops.markTTL = req.TTL
	}
	return ops
}

// markUndone leaves a refused waiting writer's mark on the nodes that
// granted it before the undo (the nodes that refused it marked it
// themselves), so that new readers are held back on every node.
func (d *Driver) markUndone(ctx context.Context, ops *lockOps, all []result[redisscript.AcquireResult], timeout time.Duration) {
	var which []int
	for _, r := range all {
		if r.err == nil && r.v.Granted {
			which = append(which, r.i)
		}
	}
	if len(which) == 0 {
		return
	}
	results := fanoutTo(d, context.WithoutCancel(ctx), timeout, which, func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, ops.mark(ctx, n)
	})
	for range which {
		<-results
	}
}

// Withdraw removes req.Owner's waiting writer mark from the read/write lock
// of req.Name on every node (driver.Withdrawer); a node where it was the
// last mark wakes the readers it held back. Other kinds have no marks: it
// does nothing for them. It fails only when no node answered (the marks
// then expire a TTL after the writer's last attempt). After Close has begun
// it fails with an error wrapping dlock.ErrClosed.
func (d *Driver) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	if req.Kind != driver.Write {
		return nil
	}
	if !d.gate.Enter() {
		return errClosed
	}
	defer d.gate.Exit()
	kk := redisscript.KindKeysFor(d.prefix, req.Name, driver.Write)
	results := fanout(d, ctx, d.timeoutFor(req.TTL), func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, redisscript.Withdraw(ctx, n.client, kk, req.Owner)
	})
	var firstErr error
	ok := 0
	for range d.nodes {
		r := <-results
		if r.err == nil {
			ok++
		} else if firstErr == nil {
			firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
		}
	}
	if ok == 0 {
		return ctxerr.Wrap(ctx, "redlock: withdraw", firstErr)
	}
	return nil
}

// acquireKind is Acquire for one side of a read/write lock: TryAcquire
// again whenever a release of the name is published on a node, when the
// refusal's RetryAfter has passed, and at least every TTL/3 (which keeps a
// waiting writer's marks alive). A Write marks itself as a waiting writer
// and withdraws when it gives up.
func (d *Driver) acquireKind(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	req.Waiting = true
	ch := redisscript.KeysFor(d.prefix, req.Name).Channel
	sig := make(chan struct{}, 1)
	var subs []*redisscript.Sub
	defer func() {
		for _, s := range subs {
			s.Close(false)
		}
	}()
	giveUp := func() {
		if req.Kind != driver.Write || !d.gate.Enter() {
			return
		}
		defer d.gate.Exit()
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = d.Withdraw(wctx, req)
	}
	subscribed := false
	for {
		sent := time.Now()
		g, err := d.TryAcquire(ctx, req)
		if err == nil {
			if g.Sent.IsZero() {
				g.Sent = sent
			}
			return g, nil
		}
		var le *driver.LockedError
		if !errors.As(err, &le) {
			giveUp()
			return driver.Grant{}, err
		}
		if !subscribed {
			subscribed = true
			subs, _ = d.subscribeEach(ctx, ch, sig)
			if subs != nil {
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
			return driver.Grant{}, ctxerr.Wrap(ctx, "redlock: acquire", ctx.Err())
		case <-sig:
			t.Stop()
		case <-t.C:
		}
	}
}

var _ driver.FenceRaiser = (*Driver)(nil)

// RaiseFence raises the fencing counter of kind k of name (the mutex's, or
// the read/write lock's shared one) to at least atLeast on every node
// (driver.FenceRaiser), and succeeds only once every node did. A quorum of
// raised nodes is not enough: a node held by another owner since before
// the raise (a grant of a slow or failed attempt) proves nothing, since
// that owner can complete its own quorum with it and with an unraised node
// once the caller releases there, with a token below atLeast (see
// TestRaiseFenceHeldNodes). With every node raised, a later grant's quorum
// includes a node it was granted after the raise: one the caller held
// during the raise, when the caller holds a quorum (the quorum lock's use),
// or any node granted afresh. A node that is down or slow therefore fails
// the raise; the quorum lock then counts this backend as not raised.
// Semaphores are not supported. After Close has begun it fails with an
// error wrapping dlock.ErrClosed.
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if !d.SupportsKind(k) {
		return fmt.Errorf("redlock: raise fence: lock kind %v: %w", k, driver.ErrUnsupported)
	}
	if !d.gate.Enter() {
		return errClosed
	}
	defer d.gate.Exit()
	key := redisscript.FenceKey(d.prefix, name, k)
	results := fanout(d, ctx, d.timeoutFor(0), func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, redisscript.RaiseFence(ctx, n.client, key, atLeast)
	})
	ok := 0
	var firstErr error
	for range d.nodes {
		r := <-results
		if r.err == nil {
			ok++
		} else if firstErr == nil {
			firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
		}
	}
	if ok < len(d.nodes) {
		return ctxerr.Wrap(ctx, "redlock: raise fence", fmt.Errorf("raised on %d of %d nodes, every node is needed: %w", ok, len(d.nodes), firstErr))
	}
	return nil
}
