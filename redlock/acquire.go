package redlock

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"sort"
	"time"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/redisscript"
)

// TryAcquire runs Redlock's acquire (see the package doc). Grant.TTL is
// zero: the lease lasts the requested TTL from when the requests were sent.
// The driver returns a quorum's grant (fencing write-back included) however
// long that took; judging it is the dlock package's job, which keeps the
// validity deadline (TTL minus its Options.Drift, from the send) and
// releases a grant that arrives after it.
//
// A key that dlock did not write, of any type, at the lock's key on a node
// (or at its fencing counter while the lock is free there) is a lock held
// there by an unknown owner: it is never overwritten, and counts as a
// refusal whose node frees at that key's PTTL, or never (until somebody
// deletes it) when it has no expiry.
//
// After Close has begun it fails with an error wrapping dlock.ErrClosed; a
// grant that completes while Close runs is not returned but released on
// every node by Close.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.tryAcquire(ctx, req, 0, nil, nil)
}

// tryAcquire is TryAcquire, for a mutex waiter queued at score if score is
// not zero (see Acquire): a refusal then queues it on the refusing nodes,
// an undo puts it back in the queue of the nodes whose grant it released,
// and after a grant it leaves the queue of the nodes that did not grant.
// st, if not nil, staggers the first attempt's node calls (see stagger).
// gs, if not nil, is the queued waiter's grants (see grant.go): its
// refused attempts ask for grants, and adopt those made.
func (d *Driver) tryAcquire(ctx context.Context, req driver.AcquireRequest, score int64, st *stagger, gs *grantState) (driver.Grant, error) {
	if !d.gate.Enter() {
		return driver.Grant{}, errClosed
	}
	defer d.gate.Exit()
	if req.Kind != driver.Exclusive && !d.SupportsKind(req.Kind) {
		return driver.Grant{}, fmt.Errorf("redlock: acquire: lock kind %v: %w", req.Kind, driver.ErrUnsupported)
	}
	start := time.Now()
	timeout := d.timeoutFor(req.TTL)
	ops := d.opsFor(req)
	if score != 0 && ops.kind == nil {
		ops.queued(score)
		if gs != nil {
			ops.grants, ops.grantCh = gs, d.grantCh
		}
	}
	for try := 1; ; try++ {
		g, leftovers, err := d.attempt(ctx, req, &ops, timeout, start, st)
		st = nil
		if !leftovers {
			return g, err
		}
		if try == maxLeftoverTries || ctx.Err() != nil {
			return driver.Grant{}, &driver.LockedError{RetryAfter: time.Millisecond}
		}
	}
}

// maxLeftoverTries bounds the attempts of one TryAcquire that found and
// cleared leftover grants of its own owner (see attempt).
const maxLeftoverTries = 3

// attempt is one round of Redlock's acquire. leftovers reports that a
// quorum granted, but some nodes only re-entered a grant of the same owner
// that is not a live lease (fewer than a quorum of nodes hold it with one
// token): what a failed attempt whose undo never reached a node leaves
// behind. Such a re-entry neither increments the node's fencing counter
// nor reports it, so a token chosen from it could repeat an earlier
// grant's; attempt then releases everything it got, clears the leftovers,
// and the caller tries again afresh.
func (d *Driver) attempt(ctx context.Context, req driver.AcquireRequest, ops *lockOps, timeout time.Duration, start time.Time, st *stagger) (driver.Grant, bool, error) {
	n := len(d.nodes)
	var results <-chan result[redisscript.AcquireResult]
	var late *lateCalls
	var sink *countdown // the node calls' countdown (not staggered)
	if st != nil && st.first != 0 && bits.OnesCount64(st.first) < d.quorum && st.first < 1<<n {
		late = d.launchEarly(ctx, ops, timeout, st)
		results = late.out
	} else {
		// No decision can be made on fewer answers than the smaller of a
		// quorum (of grants) and N − quorum + 1 (refusals): wait for that
		// many at once, woken once rather than once per answer.
		out := make(chan result[redisscript.AcquireResult], n)
		sink = newCountdown(min(d.quorum, n-d.quorum+1))
		fanoutOn(d, ctx, timeout, nil, ops.acquire, out, false, sink)
		<-sink.done
		results = out
	}
	got := make([]result[redisscript.AcquireResult], 0, n)
	var (
		granted, refused int
		failed           int
		firstErr         error
		reentered        bool
	)
	for len(got) < n {
		var r result[redisscript.AcquireResult]
		if late != nil {
			r = late.next(d, ctx, ops, timeout)
			if len(got) == 0 {
				late.firstAnswer(timeout)
			}
		} else {
			r = <-results
		}
		got = append(got, r)
		switch {
		case r.err != nil:
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
		case r.v.Granted:
			granted++
			reentered = reentered || r.v.Count > 1
		default:
			refused++
		}
		if granted >= d.quorum || refused+failed > n-d.quorum {
			break
		}
	}
	if late != nil {
		// What follows waits for every node's answer.
		late.launchRest(d, ctx, ops, timeout)
	}
	if granted >= d.quorum && reentered {
		// A re-entry is judged on every node's answer.
		for len(got) < n {
			got = append(got, <-results)
		}
	}
	maxFence, maxCount := maxima(got)
	if granted >= d.quorum {
		if reentered {
			token, live := liveReentry(got, d.quorum)
			if !live {
				d.undo(ctx, ops, got, results, timeout, start, false)
				d.clearLeftovers(ctx, ops, got, timeout)
				return driver.Grant{}, true, nil
			}
			maxFence = token
		}
		err := d.fence(ctx, timeout, ops, maxFence, got)
		if err == nil {
			d.book(ops, start)
			if d.gate.Stopped() {
				return driver.Grant{}, false, fmt.Errorf("redlock: acquire: granted while closing, released by Close: %w", dlock.ErrClosed)
			}
			if ops.isQueued() {
				// Out of the queue of the nodes that did not grant.
				var which []int
				for _, r := range got {
					if r.err != nil || !r.v.Granted {
						which = append(which, r.i)
					}
				}
				if len(which) > 0 {
					d.gate.Add(1)
					go func() {
						defer d.gate.Done()
						d.leaveNodes(ctx, ops, which, timeout)
					}()
				}
			}
			h := &handle{ref: ops.ref, kind: ops.kind}
			d.settle(ctx, h, ops, timeout, results, got, sink)
			key := ops.keys.Lock
			if ops.kind != nil {
				// The writer's key, or the readers' set.
				key = ops.kind.Writer
				if ops.kind.Kind == driver.Read {
					key = ops.kind.Holders
				}
			}
			return driver.Grant{Token: maxFence, Count: int(maxCount), Key: key, Handle: h}, false, nil
		}
		_ = d.undo(ctx, ops, got, results, timeout, start, true)
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "redlock: acquire", err)
	}
	all := d.undo(ctx, ops, got, results, timeout, start, false)
	if ops.hasMark() {
		d.markUndone(ctx, ops, all, timeout)
	}
	answered := 0
	for _, r := range all {
		if r.err == nil {
			answered++
		}
	}
	if answered < d.quorum || refused == 0 {
		return driver.Grant{}, false, ctxerr.Wrap(ctx, "redlock: acquire", fmt.Errorf("only %d of %d nodes answered, a quorum is %d: %w", answered, n, d.quorum, firstErr))
	}
	return driver.Grant{}, false, &driver.LockedError{RetryAfter: d.retryAfter(req, all, time.Since(start)), Token: maxFence}
}

// maxima returns the largest token (granted, or a refusing holder's) and
// the largest hold count among the answers.
func maxima(got []result[redisscript.AcquireResult]) (fence, count uint64) {
	for _, r := range got {
		if r.err != nil {
			continue
		}
		fence = max(fence, r.v.Fence)
		if r.v.Granted {
			count = max(count, uint64(r.v.Count))
		}
	}
	return fence, count
}

// liveReentry reports whether the re-entries among the answers are those
// of a live lease: a quorum of nodes re-entered one grant (same token).
// Only then is the token kept; nodes where that lease had lapsed granted
// afresh and get the token written back by fence.
func liveReentry(got []result[redisscript.AcquireResult], quorum int) (uint64, bool) {
	byToken := map[uint64]int{}
	for _, r := range got {
		if r.err == nil && r.v.Granted && r.v.Count > 1 {
			byToken[r.v.Fence]++
		}
	}
	for token, c := range byToken {
		if c >= quorum {
			return token, true
		}
	}
	return 0, false
}

// clearLeftovers releases, after undo released this attempt's own hold,
// the holds left before it on nodes that answered with a re-entry: the
// owner's lease is not live (see liveReentry), so they are a dead
// attempt's remains, and the next attempt must find the nodes free.
func (d *Driver) clearLeftovers(ctx context.Context, ops *lockOps, got []result[redisscript.AcquireResult], timeout time.Duration) {
	var which []int
	holds := map[int]int{}
	for _, r := range got {
		if r.err == nil && r.v.Granted && r.v.Count > 1 {
			which = append(which, r.i)
			holds[r.i] = r.v.Count - 1
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	redisscript.OnEach(which, func(i int) error {
		for range holds[i] {
			left, held, err := ops.release(rctx, d.nodes[i], false)
			if err != nil || !held || left == 0 {
				return err
			}
		}
		return nil
	})
}

// retryAfter estimates when a quorum of nodes could be free: the nodes we
// got are free at once (we released them), refusing nodes when their key
// expires. When the refusals do not come from one owner holding a quorum,
// it was a split vote among contenders who have all released by now (an
// undo publishes nothing, so nobody is woken by it): retry after a random
// delay of one to four times what this attempt took, so that the
// contenders do not collide again.
func (d *Driver) retryAfter(req driver.AcquireRequest, got []result[redisscript.AcquireResult], took time.Duration) time.Duration {
	var free []time.Duration
	holders := map[string]int{}
	for _, r := range got {
		switch {
		case r.err != nil:
		case r.v.Granted:
			free = append(free, 0)
		default:
			if r.v.NoExpiry {
				free = append(free, never)
			} else {
				free = append(free, r.v.PTTL)
			}
			h := r.v.Holder
			if r.v.Foreign {
				h = foreignHolder
			}
			holders[h]++
		}
	}
	split := true
	for h, c := range holders {
		if c >= d.quorum-(len(d.nodes)-len(got)) && h != req.Owner {
			split = false
		}
	}
	if split {
		took = max(took, 100*time.Microsecond)
		return took + rand.N(3*took)
	}
	if len(free) < d.quorum {
		return 0
	}
	sort.Slice(free, func(i, j int) bool { return free[i] < free[j] })
	if free[d.quorum-1] == never {
		return 0 // held by keys without expiry: unknown
	}
	return free[d.quorum-1]
}

// never stands for the free time of a node held by a key without expiry.
const never = time.Duration(math.MaxInt64)

// foreignHolder stands for an unknown owner (a key dlock did not write) in
// maps keyed by owner; owners are printable ASCII, so it is no owner.
const foreignHolder = "\x00foreign"

// fence makes sure a quorum of the nodes that granted this acquire has a
// fencing counter of at least token before the grant is returned. Only
// granting nodes count: each is held by this owner, so no other grant can
// be made there until this one is released or lapses, and any later
// quorum shares one of them with it; that node's counter already had the
// token. A node that refused (another owner holds it) counts for nothing,
// even once its counter has the token: its holder was granted there with
// a smaller token before the write-back, and could complete its quorum on
// a granting node of ours whose counter is still behind, after we release
// it, with a token below ours. Granting nodes whose counter is at least
// the token (a fresh grant beside a live re-entry may be above it) count
// already; when they are not a quorum, the token is written back to the
// other granting nodes and fence waits until enough have it.
// Nodes still busy with the acquire are left alone: a write-back that
// overtook its acquire there would make that node's grant count from the
// token. Refusing nodes and lagging granting nodes get the token in the
// background either way.
func (d *Driver) fence(ctx context.Context, timeout time.Duration, ops *lockOps, token uint64, got []result[redisscript.AcquireResult]) error {
	have := 0
	var lagging, others []int
	for _, r := range got {
		switch {
		case r.err != nil:
		case !r.v.Granted:
			others = append(others, r.i)
		case r.v.Fence >= token:
			have++
		default:
			lagging = append(lagging, r.i)
		}
	}
	if have >= d.quorum {
		others = append(others, lagging...)
		lagging = nil
	}
	if len(others) > 0 {
		_ = fanoutTo(d, context.WithoutCancel(ctx), timeout, others, func(ctx context.Context, n *node) (struct{}, error) {
			return struct{}{}, ops.fence(ctx, n, token)
		})
	}
	if have >= d.quorum {
		return nil
	}
	return d.writeFence(ctx, timeout, ops, token, lagging, d.quorum-have)
}

// writeFence raises the fencing counter to token on the nodes listed (that
// granted the acquire) and returns once need of them have it.
func (d *Driver) writeFence(ctx context.Context, timeout time.Duration, ops *lockOps, token uint64, nodes []int, need int) error {
	results := fanoutTo(d, ctx, timeout, nodes, func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, ops.fence(ctx, n, token)
	})
	ok, failed := 0, 0
	var firstErr error
	for ok < need && failed <= len(nodes)-need {
		r := <-results
		if r.err != nil {
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
			continue
		}
		ok++
	}
	if ok < need {
		return fmt.Errorf("fencing token reached %d of %d nodes, a quorum is %d: %w", d.quorum-need+ok, len(d.nodes), d.quorum, firstErr)
	}
	return nil
}

// undo releases a failed acquire on every node that granted it or may have:
// it first waits for the nodes still answering (bounded by the node
// timeout), so that no release overtakes its own acquire. It returns every
// node's result. The releases publish nothing unless publish is set (the
// attempt reached a quorum, so others may have seen it as a holder): a
// failed attempt's partial grants are nobody's release to wait for.
//
// A release that fails (a node slower than the node timeout) leaves the
// grant on that node, of unknown outcome: the grant (sent at start) is
// then booked, so that Close releases it on every node, as it does any
// grant the driver made and nobody released; otherwise a lock an acquire
// racing Close took and could not give back outlived Close by its TTL.
func (d *Driver) undo(ctx context.Context, ops *lockOps, got []result[redisscript.AcquireResult], rest <-chan result[redisscript.AcquireResult], timeout time.Duration, start time.Time, publish bool) []result[redisscript.AcquireResult] {
	for len(got) < len(d.nodes) {
		got = append(got, <-rest)
	}
	var which []int
	for _, r := range got {
		if r.err != nil || r.v.Granted {
			which = append(which, r.i)
		}
	}
	if len(which) == 0 {
		return got
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	errs := redisscript.OnEach(which, func(i int) error {
		_, _, err := ops.release(rctx, d.nodes[i], publish)
		if ops.isQueued() {
			// The grant took the waiter out of this node's queue: its
			// place is kept (same score), so that the nodes keep ordering
			// the waiters alike.
			_ = ops.requeue(rctx, d.nodes[i])
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			d.book(ops, start)
			break
		}
	}
	return got
}

// leaveNodes takes a granted waiter out of the queues of the nodes listed,
// best effort, detached from ctx's end.
func (d *Driver) leaveNodes(ctx context.Context, ops *lockOps, which []int, timeout time.Duration) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	redisscript.OnEach(which, func(i int) error { return ops.leave(rctx, d.nodes[i]) })
}
