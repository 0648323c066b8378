package redlock

import (
	"context"
	"fmt"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Release releases one hold on every node. It returns the largest hold
// count left on any node, or ErrNotHeld when more than N − quorum nodes
// answered that they did not hold the lock for l.Owner (the lease was gone
// on a majority, so another owner may hold it: a late Unlock never reports
// success). After Close has begun it fails with an error
// wrapping dlock.ErrClosed (Close has released, or is releasing, every
// grant of the driver).
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if !d.gate.Enter() {
		return 0, errClosed
	}
	defer d.gate.Exit()
	ops := d.opsForLease(l)
	type rel struct {
		remaining int
		held      bool
	}
	timeout := d.timeoutFor(l.TTL)
	release := func(ctx context.Context, n *node) (rel, error) {
		r, held, err := ops.release(ctx, n, true)
		return rel{r, held}, err
	}
	results := make(chan result[rel], len(d.nodes))
	all := newCountdown(len(d.nodes))
	var s *settling
	if h, ok := l.Handle.(*handle); ok && h != nil {
		s = h.settled.Load()
	}
	// The last node's release runs on this goroutine, which waits for
	// every node anyway.
	if s == nil {
		fanoutOn(d, ctx, timeout, nil, release, results, true, all)
	} else {
		// Each node is released once it answered the acquire (a release
		// must not overtake it): the nodes that did at once, each other
		// one by settle as its answer arrives (within the node timeout,
		// whatever ctx), on settle's goroutine for the last of them.
		launch := func(i int, inline bool) {
			fanoutOn(d, ctx, timeout, []int{i}, release, results, inline, all)
		}
		var ready []int
		for i := range d.nodes {
			if !s.after(i, launch) {
				ready = append(ready, i)
			}
		}
		if len(ready) > 0 {
			fanoutOn(d, ctx, timeout, ready, release, results, true, all)
		}
	}
	<-all.done // every answer is in results
	remaining, held, notHeld := 0, 0, 0
	var firstErr error
	for range d.nodes {
		r := <-results
		switch {
		case r.err != nil:
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
		case r.v.held:
			held++
			remaining = max(remaining, r.v.remaining)
		default:
			notHeld++
		}
	}
	// A node whose release failed may still hold the lock: the grant then
	// stays booked, so that Close releases it there (on every node) if
	// nobody does first.
	switch {
	case notHeld > len(d.nodes)-d.quorum:
		// Too few nodes held it for the lease to be alive: it had expired
		// (or been lost) on a majority, and another owner may have been
		// granted it since. Whatever holds were left are released, but the
		// caller must learn that its lease was gone, never a success.
		if firstErr == nil {
			d.grants.Released(ops.id, l.Owner, held > 0)
		}
		return 0, driver.ErrNotHeld
	case held > 0:
		if firstErr == nil {
			d.grants.Released(ops.id, l.Owner, true)
		}
		return remaining, nil
	default:
		return 0, ctxerr.Wrap(ctx, "redlock: release", fmt.Errorf("released on no node, %d of %d did not answer: %w", len(d.nodes)-notHeld, len(d.nodes), firstErr))
	}
}
