package etcdlock

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

var _ driver.MultiAcquirer = (*Driver)(nil)

// TryAcquireMulti implements driver.MultiAcquirer: one transaction puts the
// queue key of every name, only if no name's queue holds any key (a holder
// or a waiter, dlock's or etcdctl's) and no name has a lock-delay guard; it
// writes the names' lock-delay guards in the same transaction. So it takes
// every name or none, in one round trip, and a refusal leaves nothing
// behind. Every grant's token is the transaction's revision (one token for
// all names: each is still above every earlier grant of its own name).
//
// A set of which the driver holds a name for the owner already (a
// re-entry), or takes one meanwhile, is refused with ErrUnsupported, so the
// dlock package takes the names one by one. When the outcome is unknown
// the keys that may have been put are removed (in the background if need
// be) before the error is returned.
func (d *Driver) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	ctx = rpcCtx(ctx)
	begun := 0
	var hs []*handle
	granted := false
	defer func() {
		for i := range begun {
			var h *handle
			if granted {
				h = hs[i]
			}
			d.holds.End(reqs[i].Name, reqs[i].Owner, h, granted)
		}
	}()
	for _, r := range reqs {
		if r.Kind != driver.Exclusive {
			return nil, fmt.Errorf("etcdlock: multi-acquire of a %v lock: %w", r.Kind, driver.ErrUnsupported)
		}
		if !d.holds.Begin(r.Name, r.Owner) {
			return nil, fmt.Errorf("etcdlock: multi-acquire: %q is held or being taken by %q on this driver already: %w", r.Name, r.Owner, driver.ErrUnsupported)
		}
		begun++
	}
	var cmps []clientv3.Cmp
	var puts []clientv3.Op
	for _, r := range reqs {
		secs, err := d.leaseSeconds(r.TTL)
		if err != nil {
			return nil, err
		}
		sess, err := d.session(ctx, secs)
		if err != nil {
			return nil, err
		}
		var delayLease clientv3.LeaseID
		if r.LockDelay > 0 {
			if delayLease, err = d.delayLease(ctx, sess, r.LockDelay); err != nil {
				return nil, err
			}
		}
		h := d.newHandle(driver.Exclusive, r.Name, sess)
		guard := d.guardKey(r.Name)
		hs = append(hs, h)
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(d.queuePrefix(r.Name)), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(guard), "=", 0))
		puts = append(puts, clientv3.OpPut(h.key, r.Owner, clientv3.WithLease(sess.id)))
		if r.LockDelay > 0 {
			h.delay.Store(int64(r.LockDelay))
			puts = append(puts, clientv3.OpPut(guard, h.key, clientv3.WithLease(delayLease)))
		}
	}
	resp, err := d.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		for _, h := range hs {
			d.discardGuarded(h)
		}
		return nil, ctxerr.Wrap(ctx, "etcdlock: multi-acquire", err)
	}
	if !resp.Succeeded {
		for _, h := range hs {
			h.sess.freeSlot(h)
		}
		return nil, d.multiRefused(ctx, reqs)
	}
	gs := make([]driver.Grant, len(hs))
	for i, h := range hs {
		h.rev = resp.Header.Revision
		gs[i] = d.grant(h, 1, h.sess.RefreshedAt())
		h.sess.track(h)
	}
	granted = true
	return gs, nil
}

// discardGuarded is discard for a key whose put may have written a
// lock-delay guard too, or that may have had one written since: the guard
// goes first (it names the key, so it can only be this attempt's), then the
// key. A guard left behind would block the lock for as long as its driver
// keeps the delay lease alive, so a failed delete of it is tried again in
// the background while the lease lives, like discard's.
func (d *Driver) discardGuarded(h *handle) {
	if h.guarded() && d.dropGuard(h) != nil {
		d.retryInBackground(h, func() error { return d.dropGuard(h) }, nil)
	}
	d.discard(h, 0)
}

// dropGuard deletes h's lock-delay guard if it names h's key.
func (d *Driver) dropGuard(h *handle) error {
	guard := d.guardOf(h)
	ctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
	defer cancel()
	_, err := d.cli.Txn(rpcCtx(ctx)).
		If(clientv3.Compare(clientv3.Value(guard), "=", h.key)).
		Then(clientv3.OpDelete(guard)).
		Commit()
	return err
}

// multiRefused says why a multi-acquire's compares failed. Each compare
// covers a name's whole queue prefix, which also holds the keys of names
// nested below it ("a/b" under "a/"): when no name has a queue key or a
// guard of its own, only nested names stood in the way, and the set is
// refused with ErrUnsupported so that the dlock package takes the names one
// by one (which skips nested keys). Otherwise it is ErrLocked.
func (d *Driver) multiRefused(ctx context.Context, reqs []driver.AcquireRequest) error {
	for _, r := range reqs {
		pfx := d.queuePrefix(r.Name)
		resp, err := d.cli.Txn(ctx).Then(
			clientv3.OpGet(pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(d.guardKey(r.Name), clientv3.WithKeysOnly()),
		).Commit()
		if err != nil {
			return &driver.LockedError{}
		}
		if len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
			return &driver.LockedError{}
		}
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			if inQueue(pfx, kv.Key) {
				return &driver.LockedError{}
			}
		}
	}
	return fmt.Errorf("etcdlock: multi-acquire: a name's queue prefix holds keys of names nested below it: %w", driver.ErrUnsupported)
}
