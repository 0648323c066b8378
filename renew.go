package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
)

// renewer renews every auto-renewing lease of a Client. On each tick it sends
// one driver.Renew call covering every lease that is due, or due within half
// its interval, so leases taken at different times fall into step and K
// leases cost one round trip per tick rather than K.
type renewer struct {
	c    *Client
	wake chan struct{}
}

func newRenewer(c *Client) *renewer {
	return &renewer{c: c, wake: make(chan struct{}, 1)}
}

// poke makes the renewer recompute its schedule (a lease was added or
// extended).
func (r *renewer) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *renewer) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		next, batch := r.due(now)
		if len(batch) > 0 {
			r.renewBatch(batch)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(now), time.Millisecond)
		}
		// Since Go 1.23 Reset discards a value the timer sent before:
		// no drain needed.
		timer.Reset(wait)
		select {
		case <-r.c.closing:
			return
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// due returns the leases to renew now, or the time the next one falls due.
// When at least one lease is due, every lease due within half its interval
// joins the batch.
func (r *renewer) due(now time.Time) (next time.Time, batch []*Lease) {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	anyDue := false
	for l := range c.leases {
		if !l.autoRenew {
			continue
		}
		l.mu.Lock()
		at, every, skip := l.nextRenew, l.renewEvery, l.err != nil || l.releasing
		l.mu.Unlock()
		if skip {
			continue
		}
		if !at.After(now) {
			anyDue = true
		}
		if !at.After(now.Add(every / 2)) {
			batch = append(batch, l)
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	if !anyDue {
		batch = nil
	}
	return next, batch
}

func (r *renewer) renewBatch(batch []*Lease) {
	c := r.c
	now := time.Now()
	ls := make([]driver.Lease, len(batch))
	deadline := now.Add(time.Hour)
	for i, l := range batch {
		l.mu.Lock()
		ls[i] = l.driverLeaseLocked()
		if l.validUntil.Before(deadline) {
			deadline = l.validUntil
		}
		l.mu.Unlock()
	}
	// Nothing is gained by waiting for a reply past the earliest validity
	// deadline of the batch; the loss timers fire then anyway.
	timeout := max(deadline.Sub(now), 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(c.closeCtx, timeout)
	sent := time.Now()
	errs, err := c.d.Renew(ctx, ls)
	cancel()
	if err == nil && len(errs) != len(ls) {
		err = fmt.Errorf("driver returned %d results for %d leases", len(errs), len(ls))
	}
	for i, l := range batch {
		e := err
		if e == nil {
			e = errs[i]
		}
		switch {
		case e == nil:
			l.mu.Lock()
			l.confirmedLocked(sent)
			l.mu.Unlock()
		case gone(e):
			l.lose(e)
		default:
			// Fate unknown: try again soon, but never past the validity
			// deadline, which the loss timer enforces on its own.
			l.mu.Lock()
			t := time.Now()
			retry := min(l.renewEvery/4, max(l.validUntil.Sub(t)/3, time.Millisecond))
			l.nextRenew = t.Add(max(retry, time.Millisecond))
			l.mu.Unlock()
			c.log.Warn("dlock: renewal failed, will retry", "name", l.name, "err", e)
		}
	}
}
