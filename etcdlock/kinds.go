package etcdlock

// Read/write locks and semaphores.
//
// Each kind of a name is its own queue of keys, bound to the same leases as
// the mutex's and granted, like it, in create-revision order:
//
//	<prefix><name>/<lease>-<slot>              the mutex (unchanged)
//	<prefix><name>\x00rw/r/<lease>-<slot>      a reader of the read/write lock
//	<prefix><name>\x00rw/w/<lease>-<slot>      a writer of the read/write lock
//	<prefix><name>\x00sem/<lease>-<slot>       a permit of the semaphore
//	<prefix><name>\x00rwdelay/r|w/<lease>-<slot>  a read or write holder's lock-delay guard
//	<prefix><name>\x00semdelay/<lease>-<slot>  a permit holder's lock-delay guard
//
// Names hold no control characters, so none of these can be another name's
// queue, and none lies under the mutex's "<name>/" range (etcdctl lock and
// concurrency.Mutex see nothing of them).
//
// Rules, each decided on one linearizable read (a transaction):
//   - A reader is granted when no writer key is older than its own and no
//     writer's lock-delay guard remains. It waits for the youngest older
//     writer key (then for a guard).
//   - A writer is granted when no key at all is older than its own and no
//     other guard remains. It waits for the youngest older key.
//   - A permit of N is granted when fewer than N keys are older than its
//     own, plus the guards of permit holders whose keys are gone (lost
//     holders within their lock-delay). It waits for the N-th older key;
//     while only lost holders' guards stand in the way, for any deletion
//     under the semaphore.
//
// Writer preference follows from the order: a waiting writer's key is older
// than any later reader's, which therefore waits behind it (and a TryRLock
// is refused while a writer is queued).
//
// Keys are granted in create-revision order: whatever blocks a key blocks
// every younger key too (the keys older than it are a subset of the younger
// key's, and the guards are the same), so an older key never waits longer.
// Tokens are the revision of the grant itself: a request granted at once
// gets its key's create revision (the transaction that put the key also
// found the way clear), and a request granted after waiting writes its key
// again and gets that write's revision (see touch). A grant's token is thus
// greater than the token of every grant before it, of either side of the
// read/write lock (the rule of driver/kinds.go) or of the semaphore, even
// when several waiting readers (or permits) are granted at once and come
// back in another order than their keys'.
//
// The semaphore's size is stored in each of its keys' value ("<permits>:
// <owner>"): an acquire whose size differs from the oldest key's is
// refused with driver.ErrInvalid and its key removed. Every key is added
// only when it agrees with the oldest key, so all keys of a queue agree;
// once the queue is empty, the next acquire sets the size anew.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

var _ driver.Kinder = (*Driver)(nil)

// SupportsKind implements driver.Kinder: mutexes, both sides of read/write
// locks, and semaphore permits.
func (d *Driver) SupportsKind(k driver.Kind) bool {
	switch k {
	case driver.Exclusive, driver.Read, driver.Write, driver.Permit:
		return true
	}
	return false
}

const (
	rwMark       = "\x00rw/"
	rwDelayMark  = "\x00rwdelay/"
	semMark      = "\x00sem/"
	semDelayMark = "\x00semdelay/"
)

// kindBase is the key prefix of the queue of kind k of name (both sides of
// the read/write lock share one), and guards the prefix of its holders'
// lock-delay guards.
func (d *Driver) kindBase(k driver.Kind, name string) (base, guards string) {
	n := d.prefix + name
	if k == driver.Permit {
		return n + semMark, n + semDelayMark
	}
	return n + rwMark, n + rwDelayMark
}

// kindKey is the key of kind k of name at slot n of lease id.
func (d *Driver) kindKey(k driver.Kind, name string, id clientv3.LeaseID, n uint32) string {
	mark, side := rwMark, ""
	switch k {
	case driver.Read:
		side = "r/"
	case driver.Write:
		side = "w/"
	case driver.Permit:
		mark = semMark
	}
	return leaseKey(d.prefix, name, mark, side, id, n)
}

// semValue is the value of a permit key: the semaphore's size and the owner.
func semValue(permits int, owner string) string {
	return strconv.Itoa(permits) + ":" + owner
}

// parseSemValue reverses semValue; ok is false for a value it cannot have
// made.
func parseSemValue(v []byte) (permits int, owner string, ok bool) {
	n, o, found := strings.Cut(string(v), ":")
	p, err := strconv.Atoi(n)
	if !found || err != nil || p < 1 {
		return 0, "", false
	}
	return p, o, true
}

// lookOps are the reads that decide whether h may be granted: see decide.
// maxRev, when not zero, restricts the queue reads to keys older than h's.
func (d *Driver) lookOps(h *handle, permits int, maxRev int64) []clientv3.Op {
	base, guards := d.kindBase(h.kind, h.name())
	older := func(opts ...clientv3.OpOption) []clientv3.OpOption {
		if maxRev > 0 {
			opts = append(opts, clientv3.WithMaxCreateRev(maxRev))
		}
		return opts
	}
	switch h.kind {
	case driver.Read:
		return []clientv3.Op{
			clientv3.OpGet(base+"w/", older(clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())...),
			clientv3.OpGet(guards+"w/", clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly()),
		}
	case driver.Write:
		return []clientv3.Op{
			clientv3.OpGet(base, older(clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(2), clientv3.WithKeysOnly())...),
			clientv3.OpGet(guards, clientv3.WithPrefix(), clientv3.WithLimit(2), clientv3.WithKeysOnly()),
		}
	default: // Permit
		return []clientv3.Op{
			clientv3.OpGet(base, clientv3.WithFirstCreate()...),
			clientv3.OpGet(base, older(clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(int64(permits)+1), clientv3.WithKeysOnly())...),
			clientv3.OpGet(guards, clientv3.WithPrefix()),
		}
	}
}

// blocker is what a request waits for: any change to key (created at
// rev), or (key empty) any deletion under prefixes.
type blocker struct {
	key      string
	rev      int64
	prefixes []string
}

func (b *blocker) same(o *blocker) bool {
	return b.key == o.key && b.rev == o.rev && slices.Equal(b.prefixes, o.prefixes)
}

// decide reads the responses of lookOps for h and returns nil when h may be
// granted, else what it waits for. A permit whose size disagrees with the
// queue's gets an error wrapping driver.ErrInvalid.
//
// A permit key with r older keys, while o lost holders' guards remain, is
// granted when r+o < permits. Since keys only ever leave the queue and a
// lost holder's key turns into its guard, r+o never grows for a key, so the
// keys granted are always the oldest ones. The first waiter (r+o = permits)
// waits for any deletion in the semaphore; a later one for its predecessor
// to change: to be deleted, or to be granted, which a waiter's grant makes
// known by writing its key again (see touch).
func (d *Driver) decide(h *handle, permits int, rs []*etcdserverpb.ResponseOp) (*blocker, error) {
	kvs := func(i int) []*mvccpb.KeyValue { return rs[i].GetResponseRange().Kvs }
	other := func(list []*mvccpb.KeyValue, own string) *mvccpb.KeyValue {
		for _, kv := range list {
			if string(kv.Key) != own {
				return kv
			}
		}
		return nil
	}
	switch h.kind {
	case driver.Read, driver.Write:
		if kv := other(kvs(0), h.key); kv != nil {
			return &blocker{key: string(kv.Key), rev: kv.CreateRevision}, nil
		}
		if kv := other(kvs(1), d.guardOf(h)); kv != nil {
			return &blocker{key: string(kv.Key), rev: kv.CreateRevision}, nil
		}
		return nil, nil
	}
	if head := kvs(0); len(head) > 0 && string(head[0].Key) != h.key {
		if n, _, ok := parseSemValue(head[0].Value); ok && n != permits {
			return nil, fmt.Errorf("etcdlock: semaphore %q has %d permits, not %d (its size is set by its first holder or waiter while any remains): %w", h.name(), n, permits, driver.ErrInvalid)
		}
	}
	var before []*mvccpb.KeyValue // newest first
	present := map[string]bool{h.key: true}
	for _, kv := range kvs(1) {
		if string(kv.Key) != h.key {
			before = append(before, kv)
			present[string(kv.Key)] = true
		}
	}
	lost := 0
	own := d.guardOf(h)
	if len(before) <= permits {
		// before holds every older key: the guards whose holder key is
		// not among them are lost holders'.
		for _, g := range kvs(2) {
			if string(g.Key) != own && !present[string(g.Value)] {
				lost++
			}
		}
	}
	switch taken := len(before) + lost; {
	case taken < permits:
		return nil, nil
	case taken > permits && len(before) > 0:
		return &blocker{key: string(before[0].Key), rev: before[0].CreateRevision}, nil
	}
	base, guards := d.kindBase(h.kind, h.name())
	return &blocker{prefixes: []string{base, guards}}, nil
}

// enqueueKind puts the key of a request of kind Read, Write or Permit and,
// when wait is set, waits for its turn (see decide).
func (d *Driver) enqueueKind(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	if req.Kind == driver.Permit && req.Permits < 1 {
		return driver.Grant{}, fmt.Errorf("etcdlock: semaphore %q: permits %d, want at least 1: %w", req.Name, req.Permits, driver.ErrInvalid)
	}
	secs, err := d.leaseSeconds(req.TTL)
	if err != nil {
		return driver.Grant{}, err
	}
	sess, err := d.session(ctx, secs)
	if err != nil {
		return driver.Grant{}, err
	}
	h := d.newHandle(req.Kind, req.Name, sess)
	value := req.Owner
	if req.Kind == driver.Permit {
		value = semValue(req.Permits, req.Owner)
	}
	ops := append([]clientv3.Op{clientv3.OpPut(h.key, value, clientv3.WithLease(sess.id))}, d.lookOps(h, req.Permits, 0)...)
	resp, sent, err := commitRefreshed(sess, d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", 0)).Then(ops...))
	if err != nil {
		d.discard(h, 0)
		return driver.Grant{}, ctxerr.Wrap(ctx, "etcdlock: enqueue", err)
	}
	if !resp.Succeeded {
		d.discard(h, 0)
		return driver.Grant{}, fmt.Errorf("etcdlock: key %q exists already (a late put of an earlier attempt; removed)", h.key)
	}
	h.rev = resp.Header.Revision
	b, err := d.decide(h, req.Permits, resp.Responses[1:])
	if err != nil {
		d.discard(h, h.rev)
		return driver.Grant{}, err
	}
	if b != nil {
		if !wait {
			d.discard(h, h.rev)
			return driver.Grant{}, &driver.LockedError{}
		}
		if sent, err = d.waitKindTurn(ctx, h, req.Permits, b); err != nil {
			d.discard(h, h.rev)
			return driver.Grant{}, err
		}
		if err := d.touch(ctx, h, value); err != nil {
			d.discard(h, h.rev)
			return driver.Grant{}, err
		}
	}
	if req.LockDelay > 0 {
		if err := d.setGuard(ctx, h, req.LockDelay); err != nil {
			d.discardGuarded(h) // the guard may have been written
			return driver.Grant{}, err
		}
	}
	g := d.grant(h, 1, sent)
	sess.track(h)
	return g, nil
}

// waitKindTurn waits for b, then looks again, until nothing stands in h's
// way. Each round starts a watch on what blocks h and then looks: a change
// between the last look and the watch is not missed, and the watch starts
// at the current revision (etcd serves a watch that starts in the past from
// a loop that catches up every 100ms). It returns the refresh time of the
// lease as of the look that found the way clear.
func (d *Driver) waitKindTurn(ctx context.Context, h *handle, permits int, b *blocker) (time.Time, error) {
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		changed, err := d.watchBlocker(wctx, b)
		if err != nil {
			cancel()
			return time.Time{}, d.waitError(ctx, h.sess, err)
		}
		ops := append([]clientv3.Op{clientv3.OpGet(h.key, clientv3.WithKeysOnly())}, d.lookOps(h, permits, h.rev-1)...)
		resp, sent, err := commitRefreshed(h.sess, d.cli.Txn(ctx).Then(ops...))
		if err != nil {
			cancel()
			return sent, d.waitError(ctx, h.sess, err)
		}
		if !present(resp.Responses[0].GetResponseRange().Kvs, h.rev) {
			cancel()
			if h.sess.Lost() {
				return sent, fmt.Errorf("etcdlock: while waiting: %w", h.sess.Cause())
			}
			return sent, fmt.Errorf("etcdlock: queue key %q was deleted while waiting: %w", h.key, driver.ErrSessionLost)
		}
		nb, err := d.decide(h, permits, resp.Responses[1:])
		if err != nil || nb == nil {
			cancel()
			return sent, err
		}
		if nb.same(b) {
			select {
			case err = <-changed:
			case <-h.sess.Done():
				err = fmt.Errorf("etcdlock: while waiting: %w", h.sess.Cause())
			case <-ctx.Done():
				err = fmt.Errorf("etcdlock: wait: %w", ctx.Err())
			case <-d.ctx.Done():
				err = errors.New("etcdlock: driver is closed")
			}
		}
		cancel()
		if err != nil {
			return sent, err
		}
		b = nb
	}
}

// waitError is the error of a failed request while h waits.
func (d *Driver) waitError(ctx context.Context, sess *session, err error) error {
	if sess.Lost() {
		return fmt.Errorf("etcdlock: while waiting: %w", sess.Cause())
	}
	if d.ctx.Err() != nil {
		return errors.New("etcdlock: driver is closed")
	}
	return ctxerr.Wrap(ctx, "etcdlock: wait", err)
}

// watchBlocker starts watching b from the current revision (any event on
// b.key, or deletions under b.prefixes) and returns once every watch
// exists. The channel receives nil after the first change (or the end of a
// watch, after which the caller looks again), or an error. The watches end
// with ctx.
func (d *Driver) watchBlocker(ctx context.Context, b *blocker) (<-chan error, error) {
	type watch struct {
		key  string
		opts []clientv3.OpOption
	}
	var ws []watch
	if b.key != "" {
		ws = append(ws, watch{b.key, []clientv3.OpOption{clientv3.WithCreatedNotify()}})
	}
	for _, p := range b.prefixes {
		ws = append(ws, watch{p, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()}})
	}
	changed := make(chan error, len(ws))
	created := make(chan error, len(ws))
	for _, w := range ws {
		wch := d.cli.Watch(ctx, w.key, w.opts...)
		go func() {
			first := true
			for wr := range wch {
				err := wr.Err()
				if err != nil && errors.Is(err, rpctypes.ErrCompacted) {
					err = nil // look again
				}
				if first && wr.Created && err == nil {
					first = false
					created <- nil
					continue
				}
				if first {
					created <- err
					return
				}
				changed <- err
				return
			}
			if first {
				created <- errors.New("watch ended")
				return
			}
			changed <- nil // the watch ended: look again
		}()
	}
	for range ws {
		select {
		case err := <-created:
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("watch: %w", err)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return changed, nil
}

// touch writes h's key again (same value, same lease) once h was granted
// after waiting, so that a waiter watching it learns of the grant (see
// decide), and makes the revision of that write h's token.
func (d *Driver) touch(ctx context.Context, h *handle, value string) error {
	resp, err := d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)).
		Then(clientv3.OpPut(h.key, value, clientv3.WithLease(h.sess.id))).
		Commit()
	if err != nil {
		return ctxerr.Wrap(ctx, "etcdlock: mark grant", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("etcdlock: queue key %q vanished as it was granted: %w", h.key, driver.ErrSessionLost)
	}
	h.token = resp.Header.Revision
	return nil
}
