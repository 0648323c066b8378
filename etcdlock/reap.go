package etcdlock

// Grants that nobody renews.
//
// A lease is shared by every lock of its TTL and kept alive by the driver's
// keepalive loop, so the server alone would keep a lock for as long as the
// driver runs, whether or not its holder still renews it. The dlock package
// ends a lease whose renewal has not been confirmed for its TTL (and a lease
// with renewal turned off once its TTL has passed) without telling the
// driver, and its Unlock then no longer reaches the driver: the lock would
// stay held until the driver closes. So the driver keeps, for every grant it
// returned, the send time of the last request that confirmed it (the grant
// itself, a re-entry, a Renew), and the keepalive loop of its lease deletes
// the key of a grant not confirmed for a whole granted TTL. That is never
// earlier than the dlock package's deadline for the same grant, which counts
// the TTL less a drift margin from an earlier send time. A grant with a
// lock-delay keeps the lock unavailable for its delay after that (armGuard),
// as if its lease had expired.

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// track adds h to the grants that s's keepalive loop reaps when nobody
// renews them.
func (s *session) track(h *handle) {
	s.mu.Lock()
	h.held = true
	s.mu.Unlock()
}

// untrack forgets h: its key is known to be gone (released, reaped, or
// found gone). Its slot is freed unless a plain delete of the key may still
// be on its way (see slots.go).
func (s *session) untrack(h *handle) {
	s.mu.Lock()
	h.held = false
	s.settleLocked(h)
	s.mu.Unlock()
}

// reap deletes the keys of s's grants that were not confirmed for a whole
// TTL. A failed delete is tried again at the next tick.
func (d *Driver) reap(ctx context.Context, s *session) {
	now := time.Now()
	var due []*handle
	s.mu.Lock()
	for _, first := range s.grants {
		for h := first; h != nil; h = h.next {
			if h.held && now.Sub(h.confirmed.Time()) >= s.ttl {
				due = append(due, h)
			}
		}
	}
	s.mu.Unlock()
	for _, h := range due {
		_, err := d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)).
			Then(clientv3.OpDelete(h.key)).
			Commit()
		if err != nil {
			continue
		}
		s.untrack(h)
		if delay := time.Duration(h.delay.Load()); delay > 0 {
			d.armGuard(ctx, h, delay)
		}
	}
}
