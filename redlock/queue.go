package redlock

import (
	"context"
	"errors"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

var _ driver.Queuer = (*Driver)(nil)

// queueWait is how long a waiter's entry in a node's queue lasts unless the
// waiter renews it; a waiter renews it every queueWait/3. A waiter that
// vanished holds up the queue for at most this.
const queueWait = 3 * time.Second

// Acquire waits for the lock in a queue kept on every node (see redislock's
// Acquire for the keys). A waiter is queued on each node at one score, the
// time of its first refusal by its own clock, so every node orders the
// waiters alike: a free node grants only to the first live waiter, and the
// waiters do not split the nodes between them, nor does a releaser asking
// again, which goes behind them. A release publishes the first waiter's
// owner on every node, which wakes that waiter only; it then runs
// TryAcquire. A waiter renews its entries (and tries again) every
// queueWait/3, and when the holder's lease would have run out.
//
// When ctx ends, the waiter leaves every node's queue (waking the next
// waiter) and Acquire returns an error wrapping ctx.Err(). An entry left
// behind by a crashed waiter is dropped after queueWait.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Kind != driver.Exclusive {
		return d.acquireKind(ctx, req)
	}
	k := redisscript.KeysFor(d.prefix, req.Name)
	sig := make(chan struct{}, 1)
	var (
		subs    []*redisscript.Sub
		score   int64
		renewed time.Time
	)
	defer func() {
		for _, s := range subs {
			s.Close(false)
		}
	}()
	for {
		sent := time.Now()
		g, err := d.TryAcquire(ctx, req)
		if err == nil {
			if g.Sent.IsZero() {
				g.Sent = sent
			}
			if score != 0 {
				// The granting nodes took the waiter out of their queue;
				// a node that did not grant may still have it first.
				d.queueOp(ctx, d.timeoutFor(req.TTL), false, func(ctx context.Context, n *node) error {
					return redisscript.Leave(ctx, n.client, k, req.Owner)
				})
			}
			return g, nil
		}
		var le *driver.LockedError
		if !errors.As(err, &le) {
			d.leaveAll(ctx, k, req, score)
			return driver.Grant{}, err
		}
		if score == 0 || time.Since(renewed) >= queueWait/3 {
			if score == 0 {
				score = time.Now().UnixMilli()
			}
			renewed = time.Now()
			d.queueOp(ctx, d.timeoutFor(req.TTL), true, func(ctx context.Context, n *node) error {
				return redisscript.Enqueue(ctx, n.client, k, req.Owner, score, queueWait)
			})
		}
		if subs == nil {
			for _, n := range d.nodes {
				if s, err := n.hub.SubscribeOwner(ctx, k.Channel, req.Owner, sig); err == nil {
					subs = append(subs, s)
				}
			}
			if subs != nil {
				continue // a release before the subscription is not missed
			}
		}
		wait := queueWait/3 - time.Since(renewed)
		if le.RetryAfter > 0 && le.RetryAfter+time.Millisecond < wait {
			wait = le.RetryAfter + time.Millisecond
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			d.leaveAll(ctx, k, req, score)
			return driver.Grant{}, ctxerr.Wrap(ctx, "redlock: acquire", ctx.Err())
		case <-sig:
			t.Stop()
		case <-t.C:
		}
	}
}

// leaveAll takes req's owner out of every node's queue, if it was queued (score
// not zero), best effort.
func (d *Driver) leaveAll(ctx context.Context, k redisscript.Keys, req driver.AcquireRequest, score int64) {
	if score == 0 {
		return
	}
	d.queueOp(ctx, d.timeoutFor(req.TTL), true, func(ctx context.Context, n *node) error {
		return redisscript.Leave(ctx, n.client, k, req.Owner)
	})
}

// queueOp runs fn on every node, unless Close has begun, detached from
// ctx's end, each bounded by timeout; if wait, it returns when all have
// answered (Close waits for them either way).
func (d *Driver) queueOp(ctx context.Context, timeout time.Duration, wait bool, fn func(context.Context, *node) error) {
	if !d.gate.Enter() {
		return
	}
	defer d.gate.Exit()
	results := fanout(d, context.WithoutCancel(ctx), timeout, func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, fn(ctx, n)
	})
	if wait {
		for range d.nodes {
			<-results
		}
	}
}
