package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Renew implements driver.Driver. Each etcd lease is kept alive by its one
// keepalive loop (see keepAlive); Renew asks the loop of every lease in the
// batch for a keepalive sent after Renew was called (concurrent Renew calls
// share one), and proves every key still in place (a key can be deleted
// while its lease lives) with one read-only transaction per 128 keys, all
// at once (one round trip of latency, two when a loop was busy sending).
//
// An etcd lease's TTL cannot change: a Lease whose TTL (rounded up to whole
// seconds) is neither the TTL its grant asked for nor the one the server
// granted fails with an error wrapping driver.ErrUnsupported, and stays held
// with its TTL. A Lease.TTL of zero means the grant's.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	ctx = rpcCtx(ctx)
	errs := make([]error, len(ls))
	hds := make([]*handle, len(ls))
	sessions := map[*session]error{}
	var live []int
	for i, l := range ls {
		hd, ok := l.Handle.(*handle)
		if !ok || hd == nil {
			errs[i] = fmt.Errorf("etcdlock: renew: foreign handle %T: %w", l.Handle, driver.ErrNotHeld)
			continue
		}
		hds[i] = hd
		if l.TTL != 0 && l.TTL != hd.sess.ttl && seconds(l.TTL) != hd.sess.want {
			errs[i] = fmt.Errorf("etcdlock: renew %q for %v: the lock's etcd lease has a fixed TTL of %v: %w", l.Name, l.TTL, hd.sess.ttl, driver.ErrUnsupported)
			continue
		}
		if hd.sess.Lost() {
			errs[i] = fmt.Errorf("%w: %w", driver.ErrNotHeld, hd.sess.Cause())
			continue
		}
		sessions[hd.sess] = nil
		live = append(live, i)
	}
	if len(live) == 0 {
		return errs, nil
	}
	sent := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	list := make([]*session, 0, len(sessions))
	for s := range sessions {
		list = append(list, s)
	}
	for _, s := range list {
		wg.Go(func() {
			err := d.keepAliveNow(ctx, s)
			mu.Lock()
			sessions[s] = err
			mu.Unlock()
		})
	}
	type chunk struct {
		idx  []int
		resp *clientv3.TxnResponse
		err  error
	}
	var chunks []*chunk
	for start := 0; start < len(live); start += maxTxnOps {
		c := &chunk{idx: live[start:min(start+maxTxnOps, len(live))]}
		chunks = append(chunks, c)
		ops := make([]clientv3.Op, len(c.idx))
		for j, i := range c.idx {
			ops[j] = clientv3.OpGet(hds[i].key, clientv3.WithKeysOnly())
		}
		wg.Go(func() { c.resp, c.err = d.cli.Txn(ctx).Then(ops...).Commit() })
	}
	wg.Wait()
	failed := 0
	var firstErr error
	for _, c := range chunks {
		for j, i := range c.idx {
			hd := hds[i]
			serr := sessions[hd.sess]
			switch {
			case serr != nil && errors.Is(serr, rpctypes.ErrLeaseNotFound):
				errs[i] = fmt.Errorf("etcdlock: lease %x not found: %w: %w", int64(hd.sess.id), driver.ErrNotHeld, driver.ErrSessionLost)
			case serr != nil && errors.Is(serr, driver.ErrSessionLost):
				errs[i] = fmt.Errorf("%w: %w", driver.ErrNotHeld, serr)
			case c.err != nil:
				errs[i] = fmt.Errorf("etcdlock: renew: %w", c.err)
				failed++
				firstErr = c.err
			case !present(c.resp.Responses[j].GetResponseRange().Kvs, hd.rev):
				hd.sess.untrack(hd)
				errs[i] = fmt.Errorf("etcdlock: key %q is gone: %w", hd.key, driver.ErrNotHeld)
				if ls[i].LockDelay > 0 {
					d.armGuard(ctx, hd, ls[i].LockDelay)
				}
			case serr != nil:
				errs[i] = fmt.Errorf("etcdlock: keep lease alive: %w", serr)
				failed++
				firstErr = serr
			default:
				hd.confirmed.Record(sent)
			}
		}
	}
	if failed == len(ls) {
		return nil, ctxerr.Wrap(ctx, "etcdlock: renew", firstErr)
	}
	return errs, nil
}

func present(kvs []*mvccpb.KeyValue, rev int64) bool {
	return len(kvs) == 1 && kvs[0].CreateRevision == rev
}
