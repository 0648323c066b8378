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
// time of its first attempt by its own clock, so every node orders the
// waiters alike: a free node grants only to the first live waiter, and the
// waiters do not split the nodes between them, nor does a releaser asking
// again, which goes behind them. A refused attempt queues the waiter (or
// renews its entry) in the same call; an attempt that got only a minority
// puts the waiter back in the queue of the nodes it released, at its
// place. A release publishes the first waiter's owner on every node, which
// wakes that waiter only; it then tries again, on each node as soon as
// that node's release names it (see stagger). A
// waiter tries again (renewing its entries) at least every queueWait/3,
// and when the holder's lease would have run out.
//
// The driver listens on a lock's release channel once for all its waiting
// Locks, and for listenLinger after the last one returned: a lock passed
// around among the driver's callers is not subscribed and unsubscribed at
// every Lock.
//
// When ctx ends, the waiter leaves every node's queue (waking the next
// waiter) and Acquire returns an error wrapping ctx.Err(). An entry left
// behind by a crashed waiter is dropped after queueWait.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Kind != driver.Exclusive {
		return d.acquireKind(ctx, req)
	}
	k := redisscript.KeysFor(d.prefix, req.Name)
	gs := newGrantState(len(d.nodes))
	var w *waiter // made at the first refusal (or listen)
	var (
		score     int64 // not zero once the waiter queues
		listening bool
		named     uint64   // nodes that published a release naming the waiter
		ops       *lockOps // for taking grants, made at the first
	)
	defer func() {
		if listening {
			d.unlisten(k.Channel, req.Owner)
		}
	}()
	// giveUp leaves the queues, stops listening and gives back the grants
	// the waiter was sent, in that order: a grant whose message comes
	// after it stopped listening is released when it comes.
	giveUp := func() {
		d.leaveAll(ctx, k, req, score)
		if listening {
			d.unlisten(k.Channel, req.Owner)
			listening = false
		}
		d.giveBack(k, req.Owner, gs)
	}
	newW := func() *waiter {
		w := newWaiter()
		w.grants = gs
		return w
	}
	if d.listened(k.Channel) {
		// Waiters of this lock are around (or were, a moment ago): queue
		// at once, already listening.
		w = newW()
		if _, err := d.listen(ctx, k.Channel, req.Owner, w); err == nil {
			listening = true
			score = time.Now().UnixMilli()
			d.subscribeGrants(ctx)
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			// A wait can end on its timer as ctx ends: no attempt on an
			// ended context (its node calls would fail with a write
			// timeout, not ctx's error).
			giveUp()
			return driver.Grant{}, ctxerr.Wrap(ctx, "redlock: acquire", err)
		}
		sent := time.Now()
		var st *stagger
		if named != 0 {
			st = &stagger{first: named, w: w}
		}
		d.attemptsBegun.Add(1)
		g, err := d.tryAcquire(ctx, req, score, st, gs)
		d.attemptsEnded.Add(1)
		took := time.Since(sent) // at least a round trip to every node it waited for
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
		if !listening {
			if w == nil {
				w = newW()
			}
			// The release channel and the grant channel are subscribed at
			// once: with a node that does not answer, each costs the node
			// timeout.
			var grantsDone chan struct{}
			if score == 0 {
				grantsDone = make(chan struct{})
				go func() {
					defer close(grantsDone)
					d.subscribeGrants(ctx)
				}()
			}
			fresh, err := d.listen(ctx, k.Channel, req.Owner, w)
			if err == nil {
				listening = true
			}
			if score == 0 {
				score = time.Now().UnixMilli()
				<-grantsDone
				continue // the next attempt queues the waiter
			}
			if fresh {
				continue // a release before the subscription is not missed
			}
		}
		// A waiter asking for grants renews its entries (and the send time
		// its grants count from) at least every quarter of its TTL, so
		// that a grant usually leaves it enough validity (see takeGrants).
		wait := min(d.renewEvery(), req.TTL/4) - time.Since(sent)
		if le.RetryAfter > 0 && le.RetryAfter+time.Millisecond < wait {
			wait = le.RetryAfter + time.Millisecond
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		var rest *time.Timer // waiting for the rest of a quorum of grants
		var restC <-chan time.Time
	waiting:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				if rest != nil {
					rest.Stop()
				}
				giveUp()
				return driver.Grant{}, ctxerr.Wrap(ctx, "redlock: acquire", ctx.Err())
			case <-w.sig:
			case <-t.C:
				break waiting
			case <-restC:
				break waiting
			}
			got, _ := gs.counted()
			if len(got) >= d.quorum {
				if ops == nil {
					o := d.opsFor(req)
					o.queued(score)
					o.grants, o.grantCh = gs, d.grantCh
					ops = &o
				}
				g, ok, err := d.takeGrants(ctx, ops, got)
				if err != nil {
					t.Stop()
					giveUp()
					return driver.Grant{}, err
				}
				if ok {
					t.Stop()
					return g, nil
				}
				break waiting // too little validity left: adopt them afresh
			}
			if len(got) == 0 || w.nodes.Load() != 0 {
				// A wake-up, no grant (or only stale ones): try again.
				break waiting
			}
			// Part of the nodes granted: the others' grants, if that
			// release made them, are a moment behind. Wait for them for
			// restWindow, then try again: the attempt adopts the grants
			// and, short of a quorum, gives them back (a split grant).
			if rest == nil {
				rest = time.NewTimer(restWindow(took, d.timeoutFor(req.TTL)))
				restC = rest.C
			}
		}
		t.Stop()
		if rest != nil {
			rest.Stop()
		}
		named = w.nodes.Swap(0)
	}
}

// renewEvery is how often a waiter tries again (renewing its entries) at
// least: queueWait/3, unless a test set Driver.renewWait.
func (d *Driver) renewEvery() time.Duration {
	if d.renewWait > 0 {
		return d.renewWait
	}
	return queueWait / 3
}

// restFloor is the least time a waiter granted by part of the nodes waits
// for the rest of a quorum of grants (see restWindow).
const restFloor = 5 * time.Millisecond

// restWindow is how long a waiter granted by fewer than a quorum of nodes
// waits for the rest of the grants before it tries again. A release sends
// its script to every node at once and each node publishes its grant as
// it runs it, so the grants of one release arrive within about one round
// trip of each other: the window is twice took (the waiter's last attempt,
// which waited for every node's answer it needed, so at least one round
// trip), at least restFloor, at most the node timeout. When the rest does
// not come by then, the release split the nodes between waiters (their
// queues disagreed): waiting longer only keeps the grant from the others.
// Trying early is no less safe than trying late: the attempt is the one
// that ran after the node timeout before (it adopts the grants, and a
// minority is undone and the waiter requeued at its place).
func restWindow(took, timeout time.Duration) time.Duration {
	return min(max(2*took, restFloor), timeout)
}

// leaveAll takes req's owner out of every node's queue, if it was queued
// (score not zero), best effort. It returns once a quorum of nodes has
// answered (the others finish in the background): the waiter is then
// behind nobody's grant on a quorum, and a node that does not answer (it
// is paused, or cut off) does not hold the giving-up Lock for its node
// timeout.
func (d *Driver) leaveAll(ctx context.Context, k redisscript.Keys, req driver.AcquireRequest, score int64) {
	if score == 0 {
		return
	}
	d.queueOp(ctx, d.timeoutFor(req.TTL), d.quorum, func(ctx context.Context, n *node) error {
		return leaveGranting(ctx, n.client, k, req.Owner)
	})
}

// queueOp runs fn on every node, unless Close has begun, detached from
// ctx's end, each bounded by timeout; it returns when wait nodes have
// answered (Close waits for them all either way).
func (d *Driver) queueOp(ctx context.Context, timeout time.Duration, wait int, fn func(context.Context, *node) error) {
	if !d.gate.Enter() {
		return
	}
	defer d.gate.Exit()
	results := fanout(d, context.WithoutCancel(ctx), timeout, func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, fn(ctx, n)
	})
	for range min(wait, len(d.nodes)) {
		<-results
	}
}
