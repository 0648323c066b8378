package etcdlock

// Lock-delay (Chubby): when a holder's grant ends without a release, the lock
// stays unavailable for the holder's LockDelay beyond the expiry.
//
// A holder that asked for a lock-delay writes a guard key next to the lock's
// queue, <prefix><name>\x00delay, whose value is its own queue key. The guard
// is bound not to the session lease but to a delay lease of the same driver
// whose TTL is the session TTL plus the lock-delay (plus one second, for the
// whole-second rounding). A mutex that is free when asked for (no key under
// its queue prefix, no guard) is taken with its guard in one transaction;
// one granted otherwise writes its guard once granted (setGuard), in one
// more request. The driver refreshes its delay leases before, and
// only together with, its session lease, so a delay lease always outlives the
// session lease by at least the lock-delay:
//
//   - Release deletes the guard with the queue key, in one transaction: the
//     lock is free at once.
//   - A crashed or cut-off holder stops refreshing both leases. Its queue key
//     goes when the session lease expires; the guard goes at least LockDelay
//     later, both measured by the server.
//   - A holder whose key was deleted under it (found by Renew) re-binds its
//     guard to a fresh lease of TTL LockDelay, so the delay runs from then.
//
// Whoever reaches the head of a queue while a guard of another holder exists
// is refused (TryAcquire) or watches the guard until it is deleted (Acquire).
// etcd's concurrency.Mutex knows nothing of guards and ignores lock-delays.

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// guardKey is the lock-delay guard of name. Names hold no control
// characters, so it can collide with no queue key of another name, and it
// sorts outside the name's queue prefix.
func (d *Driver) guardKey(name string) string {
	return d.prefix + name + "\x00delay"
}

// guardOf is h's lock-delay guard key: the lock's guard for a mutex, the
// guard of h's own key for the other kinds (see kinds.go).
func (d *Driver) guardOf(h *handle) string {
	if h.kind == driver.Exclusive {
		return d.guardKey(h.name())
	}
	base, guards := d.kindBase(h.kind, h.name())
	return guards + h.key[len(base):]
}

// blocked reports whether a guard of another holder than key exists.
func blocked(guard []*mvccpb.KeyValue, key string) bool {
	return len(guard) > 0 && string(guard[0].Value) != key
}

// delayLease returns s's delay lease for a lock-delay of delay, granting it
// on first use.
func (d *Driver) delayLease(ctx context.Context, s *session, delay time.Duration) (clientv3.LeaseID, error) {
	secs := seconds(s.ttl+delay) + 1
	s.dmu.Lock()
	defer s.dmu.Unlock()
	s.mu.Lock()
	id, ok := s.delays[secs]
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	// Granted now, it expires after now+TTL+delay, and the session lease
	// no later than now+TTL.
	resp, err := d.cli.Grant(ctx, secs)
	if err != nil {
		return 0, fmt.Errorf("etcdlock: grant lock-delay lease: %w", err)
	}
	s.mu.Lock()
	if s.delays == nil {
		s.delays = map[int64]clientv3.LeaseID{}
	}
	s.delays[secs] = resp.ID
	s.mu.Unlock()
	return resp.ID, nil
}

func (s *session) delayLeases() []clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]clientv3.LeaseID, 0, len(s.delays))
	for _, id := range s.delays {
		ids = append(ids, id)
	}
	return ids
}

// setGuard writes h's lock-delay guard, if h's key is still there.
func (d *Driver) setGuard(ctx context.Context, h *handle, delay time.Duration) error {
	id, err := d.delayLease(ctx, h.sess, delay)
	if err != nil {
		return err
	}
	// Set first: a release must delete the guard even if this write's reply
	// is lost.
	h.delay.Store(int64(delay))
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)).
		Then(clientv3.OpPut(d.guardOf(h), h.key, clientv3.WithLease(id))).
		Commit()
	if err != nil {
		return ctxerr.Wrap(ctx, "etcdlock: write lock-delay guard", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdlock: key %q vanished before its lock-delay guard was written", h.key)
	}
	return nil
}

// armGuard re-binds the guard of h (whose key is gone) to a fresh lease of
// TTL delay, so that the lock-delay runs from now rather than from when the
// driver would stop refreshing its delay lease.
func (d *Driver) armGuard(ctx context.Context, h *handle, delay time.Duration) {
	guard := d.guardOf(h)
	resp, err := d.cli.Get(ctx, guard)
	if err != nil || len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) != h.key {
		return
	}
	lease, err := d.cli.Grant(ctx, seconds(delay)+1)
	if err != nil {
		return
	}
	_, _ = d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(guard), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpPut(guard, h.key, clientv3.WithLease(lease.ID))).
		Commit()
}
