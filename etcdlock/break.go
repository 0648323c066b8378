package etcdlock

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
)

var _ driver.Breaker = (*Driver)(nil)

// Break implements driver.Breaker: it deletes the key at the head of name's
// queue in one transaction that compares its create revision (a mutex
// grant's token) with token, so a key put since is never deleted. The
// holder's session notices its key gone at its next renewal.
func (d *Driver) Break(ctx context.Context, name string, token uint64) error {
	pfx := d.queuePrefix(name)
	resp, err := d.cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return fmt.Errorf("etcdlock: break: %w", err)
	}
	for _, kv := range resp.Kvs {
		if !inQueue(pfx, kv.Key) {
			continue
		}
		// The first key in create order holds the lock.
		if uint64(kv.CreateRevision) != token {
			return fmt.Errorf("etcdlock: break %q: held with token %d, not %d: %w", name, kv.CreateRevision, token, driver.ErrNotHeld)
		}
		key := string(kv.Key)
		tr, err := d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", kv.CreateRevision)).
			Then(clientv3.OpDelete(key)).
			Commit()
		if err != nil {
			return fmt.Errorf("etcdlock: break: %w", err)
		}
		if !tr.Succeeded {
			return fmt.Errorf("etcdlock: break %q: the grant with token %d ended meanwhile: %w", name, token, driver.ErrNotHeld)
		}
		return nil
	}
	return fmt.Errorf("etcdlock: break %q: not held: %w", name, driver.ErrNotHeld)
}
