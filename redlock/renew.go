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

// Renew extends every lease on every node, one round trip per node in
// parallel (see redislock for the batching). A lease is renewed when a
// quorum renewed it; it is gone (ErrNotHeld) when more than N − quorum
// nodes no longer hold it; otherwise its fate is unknown. After Close has
// begun it fails with an error wrapping dlock.ErrClosed.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	if !d.gate.Enter() {
		return nil, errClosed
	}
	defer d.gate.Exit()
	sent := time.Now()
	items := make([]redisscript.RenewItem, len(ls))
	ids := make([]string, len(ls)) // the grants' keys in the book
	shortest := ls[0].TTL
	for i, l := range ls {
		items[i] = redisscript.RenewItem{Owner: l.Owner, TTL: l.TTL}
		ops := d.opsForLease(l)
		switch {
		case ops.kind == nil:
			items[i].Lock = ops.keys.Lock
		case l.Kind == driver.Write:
			items[i].Lock = ops.kind.Writer
		default:
			items[i].Holders, items[i].Values = ops.kind.Holders, ops.kind.Values
		}
		ids[i] = ops.id
		shortest = min(shortest, l.TTL)
	}
	timeout := max(d.timeoutFor(shortest), shortest/3)
	results := fanout(d, ctx, timeout, func(ctx context.Context, n *node) ([]error, error) {
		return redisscript.Renew(ctx, n.client, items)
	})
	ok := make([]int, len(ls))
	gone := make([]int, len(ls))
	var firstErr error
	undecided := len(ls)
	decided := func(i int) bool { return ok[i] >= d.quorum || gone[i] > len(d.nodes)-d.quorum }
	for answered := 0; answered < len(d.nodes) && undecided > 0; answered++ {
		r := <-results
		if r.err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", r.i, r.err)
			}
			continue
		}
		for i, e := range r.v {
			was := decided(i)
			switch {
			case e == nil:
				ok[i]++
			case errors.Is(e, driver.ErrNotHeld):
				gone[i]++
			default:
				if firstErr == nil {
					firstErr = fmt.Errorf("node %d: %w", r.i, e)
				}
			}
			if !was && decided(i) {
				undecided--
			}
		}
	}
	errs := make([]error, len(ls))
	anyAnswer := false
	for i := range ls {
		switch {
		case ok[i] >= d.quorum:
			anyAnswer = true
			d.grants.Renewed(ids[i], ls[i].Owner, ls[i].TTL, sent, true)
		case gone[i] > len(d.nodes)-d.quorum:
			anyAnswer = true
			errs[i] = driver.ErrNotHeld
			d.grants.Renewed(ids[i], ls[i].Owner, ls[i].TTL, sent, false)
		default:
			if ok[i] > 0 || gone[i] > 0 {
				anyAnswer = true
			}
			errs[i] = ctxerr.Wrap(ctx, "redlock: renew", fmt.Errorf("renewed on %d of %d nodes, a quorum is %d: %v", ok[i], len(d.nodes), d.quorum, firstErr))
		}
	}
	if !anyAnswer {
		return nil, ctxerr.Wrap(ctx, "redlock: renew", fmt.Errorf("no node answered: %w", firstErr))
	}
	return errs, nil
}
