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
// release serve every kind.
type lockOps struct {
	keys redisscript.Keys      // a mutex's keys (Exclusive)
	ref  *redisscript.Ref      // the same, in the compact form a grant keeps (nil for a kind)
	kind *redisscript.KindKeys // a kind's keys (nil for a mutex)
	id   string                // the grant's key in the driver's book

	acquire func(ctx context.Context, n *node) (redisscript.AcquireResult, error)
	fence   func(ctx context.Context, n *node, token uint64) error
	release func(ctx context.Context, n *node, publish bool) (remaining int, held bool, err error)
	// mark, if not nil, leaves a waiting writer's mark on a node.
	mark func(ctx context.Context, n *node) error
	// requeue and leave, set for a queued waiter (see queued), put it back
	// in a node's queue at its score after an undo released that node's
	// grant (which took it out), and take it out of a node's queue after
	// a quorum granted it.
	requeue, leave func(ctx context.Context, n *node) error
	book           func(req driver.AcquireRequest, start time.Time)
}

// opsFor returns the operations of req's lock.
func (d *Driver) opsFor(req driver.AcquireRequest) lockOps {
	if req.Kind == driver.Exclusive {
		r := redisscript.RefFor(d.prefix, req.Name)
		return d.mutexOps(&r, req.Owner, req)
	}
	return d.kindOps(redisscript.KindKeysFor(d.prefix, req.Name, req.Kind), req.Owner, req)
}

// opsForLease returns the operations of l's lock, from its handle when it
// has one.
func (d *Driver) opsForLease(l driver.Lease) lockOps {
	req := driver.AcquireRequest{Name: l.Name, Owner: l.Owner, TTL: l.TTL, LockDelay: l.LockDelay, Kind: l.Kind, Permits: l.Permits}
	h, _ := l.Handle.(*handle)
	if l.Kind == driver.Exclusive {
		if h != nil && h.ref != nil {
			return d.mutexOps(h.ref, l.Owner, req)
		}
		r := redisscript.RefFor(d.prefix, l.Name)
		return d.mutexOps(&r, l.Owner, req)
	}
	if h != nil && h.kind != nil && h.kind.Kind == l.Kind {
		return d.kindOps(*h.kind, l.Owner, req)
	}
	return d.kindOps(redisscript.KindKeysFor(d.prefix, l.Name, l.Kind), l.Owner, req)
}

// mutexOps are the operations of the mutex whose keys ref holds; a grant's
// handle and the book of grants keep ref itself (which must not change).
func (d *Driver) mutexOps(ref *redisscript.Ref, owner string, req driver.AcquireRequest) lockOps {
	k := ref.Keys()
	quiet := k
	quiet.Channel = ""
	return lockOps{
		keys: k,
		ref:  ref,
		id:   k.Lock,
		acquire: func(ctx context.Context, n *node) (redisscript.AcquireResult, error) {
			return redisscript.Acquire(ctx, n.client, k, owner, req.TTL, req.LockDelay)
		},
		fence: func(ctx context.Context, n *node, token uint64) error {
			return redisscript.WriteFence(ctx, n.client, k, owner, token)
		},
		release: func(ctx context.Context, n *node, publish bool) (int, bool, error) {
			if publish {
				return redisscript.Release(ctx, n.client, k, owner, 0)
			}
			return redisscript.Release(ctx, n.client, quiet, owner, 0)
		},
		book: func(req driver.AcquireRequest, start time.Time) { d.grants.GrantedRef(ref, owner, req.TTL, start) },
	}
}

// queued turns a mutex's ops into those of a waiter queued at score: a
// refusal queues it there (or renews its entry) in the same call.
func (ops *lockOps) queued(req driver.AcquireRequest, score int64) {
	k := ops.keys
	owner := req.Owner
	ops.acquire = func(ctx context.Context, n *node) (redisscript.AcquireResult, error) {
		return acquireWaiting(ctx, n.client, k, owner, req.TTL, req.LockDelay, score)
	}
	ops.requeue = func(ctx context.Context, n *node) error {
		return redisscript.Enqueue(ctx, n.client, k, owner, score, queueWait)
	}
	ops.leave = func(ctx context.Context, n *node) error {
		return redisscript.Leave(ctx, n.client, k, owner)
	}
}

func (d *Driver) kindOps(kk redisscript.KindKeys, owner string, req driver.AcquireRequest) lockOps {
	quiet := kk
	quiet.Channel = ""
	var mark time.Duration
	if req.Kind == driver.Write && req.Waiting {
		mark = req.TTL
	}
	ops := lockOps{
		kind: &kk,
		id:   kk.ID(),
		acquire: func(ctx context.Context, n *node) (redisscript.AcquireResult, error) {
			r, err := redisscript.AcquireKind(ctx, n.client, kk, req, mark)
			return r.AcquireResult, err
		},
		fence: func(ctx context.Context, n *node, token uint64) error {
			return redisscript.WriteFenceKind(ctx, n.client, kk, owner, token)
		},
		release: func(ctx context.Context, n *node, publish bool) (int, bool, error) {
			if publish {
				return redisscript.ReleaseKind(ctx, n.client, kk, owner, 0)
			}
			return redisscript.ReleaseKind(ctx, n.client, quiet, owner, 0)
		},
		book: func(req driver.AcquireRequest, start time.Time) { d.grants.GrantedKind(kk, owner, req.TTL, start) },
	}
	if mark > 0 {
		ops.mark = func(ctx context.Context, n *node) error { return redisscript.Mark(ctx, n.client, kk, owner, mark) }
	}
	return ops
}

// markUndone leaves a refused waiting writer's mark on the nodes that
// granted it before the undo (the nodes that refused it marked it
// themselves), so that new readers are held back on every node.
func (d *Driver) markUndone(ctx context.Context, ops lockOps, all []result[redisscript.AcquireResult], timeout time.Duration) {
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
			for _, n := range d.nodes {
				if s, err := n.hub.Subscribe(ctx, ch, sig); err == nil {
					subs = append(subs, s)
				}
			}
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
// (driver.FenceRaiser), and succeeds once a quorum of nodes did: any later
// grant's quorum then includes one of them, so its token exceeds atLeast.
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
	if ok < d.quorum {
		return ctxerr.Wrap(ctx, "redlock: raise fence", fmt.Errorf("raised on %d of %d nodes, a quorum is %d: %w", ok, len(d.nodes), d.quorum, firstErr))
	}
	return nil
}
