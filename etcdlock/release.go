package etcdlock

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Release implements driver.Driver. The last release deletes the key in a
// transaction guarded by its create revision, so it never deletes a newer
// holder's key, nor a later grant of the same owner (a key put again has a
// new create revision, and a slot whose release has an unknown outcome is
// not reused; see slots.go).
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
	hd, ok := l.Handle.(*handle)
	if !ok || hd == nil {
		return 0, fmt.Errorf("etcdlock: release: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
	}
	n, nested, err := d.holds.Release(l.Name, l.Owner, hd,
		func(hd *handle) (bool, time.Time, error) { return d.stillHeld(ctx, hd) },
		func() error { return fmt.Errorf("etcdlock: key %q is gone: %w", hd.key, driver.ErrNotHeld) })
	if nested || err != nil {
		return n, err
	}
	// While the key is ours no other holder can have written the guard, so
	// the guard (if any) is ours too.
	ops := []clientv3.Op{clientv3.OpDelete(hd.key)}
	if hd.guarded.Load() {
		ops = append(ops, clientv3.OpDelete(d.guardKey(l.Name)))
	}
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(hd.key), "=", hd.rev)).
		Then(ops...).
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
