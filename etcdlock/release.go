package etcdlock

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Release implements driver.Driver. The last release deletes the grant's
// key, which is its lease's alone, so it never deletes another holder's key;
// nor a later grant of the same owner: the key's slot is not reused while a
// delete of it may be on its way or had an unknown outcome (see slots.go).
// When the grant wrote a lock-delay guard, the key and the guard are deleted
// in one transaction guarded by the key's create revision.
//
// Release is safe to call again after an outcome that was unknown (an error
// other than ErrNotHeld): an earlier call either changed nothing, or gave up
// the hold (a nested hold is counted down only once its check succeeded; the
// last hold is forgotten locally before the delete is sent). A repeated call
// for the last hold deletes the key if it is still there and returns 0, or
// returns an error wrapping driver.ErrNotHeld when it is gone (deleted by the
// earlier call, expired with its lease, or dropped); either way the lock is
// no longer held by this grant. A Lease whose Handle is not this driver's
// (nil included) gets ErrNotHeld at once.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	ctx = rpcCtx(ctx)
	hd, ok := l.Handle.(*handle)
	if !ok || hd == nil {
		return 0, fmt.Errorf("etcdlock: release: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
	}
	n, nested, err := d.holds.Release(hd.slotName(), l.Owner, hd,
		func(hd *handle) (bool, time.Time, error) { return d.stillHeld(ctx, hd) },
		func() error { return fmt.Errorf("etcdlock: key %q is gone: %w", hd.key, driver.ErrNotHeld) })
	if nested || err != nil {
		return n, err
	}
	if hd.guarded() {
		return d.releaseGuarded(ctx, hd)
	}
	s := hd.sess
	s.mu.Lock()
	if !hd.held {
		s.mu.Unlock()
		return 0, fmt.Errorf("etcdlock: key %q with revision %d is gone: %w", hd.key, hd.rev, driver.ErrNotHeld)
	}
	hd.pending++
	s.mu.Unlock()
	// A plain delete: while it may be on its way, the key's slot is not
	// taken again, so it can only delete this grant's key (see slots.go).
	resp, err := d.cli.Delete(ctx, hd.key)
	s.mu.Lock()
	hd.pending--
	if err != nil {
		// Still tracked: if no retry gets through, the keepalive loop
		// deletes the key once the grant's TTL has passed unconfirmed.
		hd.stale = true
		s.mu.Unlock()
		return 0, ctxerr.Wrap(ctx, "etcdlock: release", err)
	}
	hd.held = false
	s.settleLocked(hd)
	s.mu.Unlock()
	if resp.Deleted == 0 {
		return 0, fmt.Errorf("etcdlock: key %q with revision %d is gone: %w", hd.key, hd.rev, driver.ErrNotHeld)
	}
	return 0, nil
}

// releaseGuarded deletes hd's key and its lock-delay guard in one
// transaction guarded by the key's create revision: while the key is ours
// no other holder can have written the guard (a mutex's guard is the lock's
// one guard, written only by a holder; the other kinds' guards are each
// holder's own), so the guard is ours too.
func (d *Driver) releaseGuarded(ctx context.Context, hd *handle) (int, error) {
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(hd.key), "=", hd.rev)).
		Then(clientv3.OpDelete(hd.key), clientv3.OpDelete(d.guardOf(hd))).
		Commit()
	if err != nil {
		// Still tracked: if no retry gets through, the keepalive loop
		// deletes the key once the grant's TTL has passed unconfirmed.
		return 0, ctxerr.Wrap(ctx, "etcdlock: release", err)
	}
	hd.sess.untrack(hd)
	if !resp.Succeeded {
		return 0, fmt.Errorf("etcdlock: key %q with revision %d is gone: %w", hd.key, hd.rev, driver.ErrNotHeld)
	}
	return 0, nil
}
