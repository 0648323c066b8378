// Package etcdlock is the dlock driver for etcd (v3 API).
//
// Import it for its side effect to make the etcd:// URL scheme available to
// dlock.Open, or call New with a *clientv3.Client you configured yourself:
//
//	import _ "github.com/dlock/dlock/etcdlock"
//	client, err := dlock.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379")
//
// # How a lock works
//
// A driver owns one etcd lease (its session), granted on first use and kept
// alive by the driver every TTL/3. Every lock the driver takes is a key
//
//	<prefix><name>/<lease ID in hex>-<hash of the owner>
//
// bound to that lease and put in a transaction that also reads the key with
// the lowest create revision under <prefix><name>/. The key with the lowest
// create revision holds the lock; the others are its queue, in arrival order.
// A waiter watches only the key just before its own (no herd) and looks again
// after that key is deleted. The fencing token is the key's create revision,
// which etcd makes strictly increasing across the whole cluster.
//
// With an empty prefix this is the layout of etcd's own concurrency.Mutex and
// of `etcdctl lock`: a dlock lock on name X and concurrency.NewMutex(s, "X")
// exclude each other. Names containing '/' or '%' have those bytes escaped
// (%2F, %25) so that the lock "a" never sees the keys of the lock "a/b"; a
// foreign client must use the escaped form to share such a name.
//
// # Sessions, TTL and loss
//
// A grant lives as long as the driver's lease, whatever TTL the request asked
// for: one lease is shared by every lock of the driver, so its TTL cannot
// vary per lock. Grant.TTL is the lease's TTL (Options.SessionTTL) counted
// from the send time of the last keepalive the server confirmed, expressed
// from the start of the acquire call: a little less than the lease TTL for
// an immediate grant, more after a long wait in the queue. When the lease
// ends (the server no longer knows it, or no keepalive was confirmed for a
// whole TTL), the Lost channel of every grant on it closes with a cause
// wrapping driver.ErrSessionLost, and a waiter whose lease ends while waiting
// returns an error at once rather than waiting on a key that no longer exists
// (etcd issue 19597). Later locks get a new lease. Choose a TTL well above
// the cluster's election time, or a leader change ends the lease.
//
// Release deletes the key only if its create revision still equals the
// grant's token, so a retried or stale release can never delete a newer
// holder's key (etcd issue 22082). A cancelled or failed Acquire deletes its
// own queue key before it returns.
//
// Re-entrance is per driver: the same owner taking the same name again on the
// same driver increments a hold count kept by the driver. The same owner
// string used through another driver (another process) has another lease,
// hence another key, and queues like any other owner.
//
// Lock-delay is supported through a guard key per lock (see delay.go): a
// holder that ends without a release keeps the lock unavailable for its
// LockDelay after its lease expired; a release frees it at once.
//
// # Guarantees
//
// Mutual exclusion holds as far as etcd's linearizable reads and writes do:
// every decision is made on a quorum-committed revision. A holder cut off from
// the cluster gives its lease up one TTL after the send time of its last
// confirmed keepalive, no later than the server expires it; a holder paused
// past that point is stopped only by the fencing token.
package etcdlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/queuelock"
)

// DefaultSessionTTL is the TTL of a driver's etcd lease when
// Options.SessionTTL is zero.
const DefaultSessionTTL = 10 * time.Second

// maxTxnOps is etcd's default limit on operations in one transaction.
const maxTxnOps = 128

// cleanupTimeout bounds the detached deletes that run after a failed or
// cancelled acquire and in Release.
const cleanupTimeout = 5 * time.Second

// Options configure a Driver. The zero value (or nil) gives the defaults.
type Options struct {
	// Prefix is prepended verbatim to every lock name to form the key prefix
	// of its queue, e.g. "/locks/". Default "": the layout of etcd's
	// concurrency.Mutex and `etcdctl lock`. URL: the path after the hosts,
	// without its leading '/'.
	Prefix string
	// SessionTTL is the TTL of the driver's lease, rounded up to whole
	// seconds. The server raises it to its own minimum (1.5 election
	// timeouts, 2s with etcd's default settings). Default DefaultSessionTTL.
	// URL: session_ttl.
	SessionTTL time.Duration
}

// Driver is a dlock driver over an etcd client. It implements driver.Driver
// and driver.Queuer. It is safe for concurrent use. Create it with New.
type Driver struct {
	cli        *clientv3.Client
	ownsClient bool
	prefix     string
	ttlSeconds int64

	bg  *queuelock.Group
	ctx context.Context // bg's: cancelled by Close

	smu  sync.Mutex // serialises lease grants
	sess *session   // the current lease, nil until first use or after loss

	holds queuelock.Holds[*handle] // re-entrance by (name, owner)
}

var (
	_ driver.Driver = (*Driver)(nil)
	_ driver.Queuer = (*Driver)(nil)
)

// session is one etcd lease. Its Session records the send time of the last
// confirmed grant or keepalive, and ends when the lease is gone.
type session struct {
	*queuelock.Session
	id  clientv3.LeaseID
	ttl time.Duration

	mu     sync.Mutex                 // guards delays
	delays map[int64]clientv3.LeaseID // lock-delay leases by TTL in seconds (see delay.go)
	dmu    sync.Mutex                 // serialises grants of delay leases
}

// handle is the Grant.Handle of this driver.
type handle struct {
	key     string
	rev     int64
	sess    *session
	guarded atomic.Bool // a lock-delay guard of this grant was written
}

// New returns a driver over cli. The driver does not close cli: Close stops
// only what the driver started (its lease keepalive) and revokes its lease.
// opts may be nil.
func New(cli *clientv3.Client, opts *Options) (*Driver, error) {
	if cli == nil {
		return nil, errors.New("etcdlock: New: client is nil")
	}
	return newDriver(cli, false, opts)
}

func newDriver(cli *clientv3.Client, owns bool, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.SessionTTL < 0 {
		return nil, fmt.Errorf("etcdlock: SessionTTL %v is negative", o.SessionTTL)
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = DefaultSessionTTL
	}
	secs := int64((o.SessionTTL + time.Second - 1) / time.Second)
	bg := queuelock.NewGroup()
	return &Driver{
		cli:        cli,
		ownsClient: owns,
		prefix:     o.Prefix,
		ttlSeconds: secs,
		bg:         bg,
		ctx:        bg.Context(),
	}, nil
}

// escapeName maps a lock name onto one path segment of the key space.
func escapeName(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
}

// queuePrefix is the key prefix under which name's queue lives.
func (d *Driver) queuePrefix(name string) string {
	return d.prefix + escapeName(name) + "/"
}

// keyFor is the queue key of owner on name under lease id.
func (d *Driver) keyFor(name, owner string, id clientv3.LeaseID) string {
	sum := sha256.Sum256([]byte(owner))
	return fmt.Sprintf("%s%x-%s", d.queuePrefix(name), int64(id), hex.EncodeToString(sum[:8]))
}

// session returns the live lease, granting one if there is none.
func (d *Driver) session(ctx context.Context) (*session, error) {
	d.smu.Lock()
	defer d.smu.Unlock()
	if d.sess != nil && !d.sess.Lost() {
		return d.sess, nil
	}
	if err := d.ctx.Err(); err != nil {
		return nil, errors.New("etcdlock: driver is closed")
	}
	sent := time.Now()
	resp, err := d.cli.Grant(ctx, d.ttlSeconds)
	if err != nil {
		return nil, fmt.Errorf("etcdlock: grant lease: %w", err)
	}
	s := &session{Session: queuelock.NewSession(sent), id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second}
	d.sess = s
	if !d.bg.Go(func() { d.keepAlive(s) }) {
		return nil, errors.New("etcdlock: driver is closed")
	}
	return s, nil
}

// keepAlive refreshes s every TTL/3 with KeepAliveOnce, recording the send
// time of each confirmed refresh, and ends s when the server no longer knows
// the lease or no refresh has been confirmed for a whole TTL (measured from
// the send time of the last confirmed one, so the driver gives up no later
// than the server does). It replaces the client library's KeepAlive, whose
// deadline is measured from when a reply arrives.
func (d *Driver) keepAlive(s *session) {
	interval := s.ttl / 3
	retry := min(interval, 200*time.Millisecond)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	end := func(format string, args ...any) {
		s.End(fmt.Errorf("etcdlock: lease %x: %s: %w", int64(s.id), fmt.Sprintf(format, args...), driver.ErrSessionLost))
	}
	for {
		select {
		case <-d.ctx.Done():
			end("driver closed")
			return
		case <-timer.C:
		}
		left := time.Until(s.RefreshedAt().Add(s.ttl))
		if left <= 0 {
			end("no keepalive confirmed within its TTL %v", s.ttl)
			return
		}
		ctx, cancel := context.WithTimeout(d.ctx, left)
		err := d.refresh(ctx, s)
		cancel()
		switch {
		case err == nil:
			timer.Reset(interval)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			end("expired or revoked")
			return
		default:
			timer.Reset(retry) // unknown: try again soon, until the TTL runs out
		}
	}
}

// TryAcquire implements driver.Driver: one transaction that enqueues the
// request and reads the head of the queue; when the request is not at the
// head its key is deleted again and a *driver.LockedError returned.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.acquire(ctx, req, false)
}

// Acquire implements driver.Queuer: it enqueues the request and waits, watching
// only the key just before its own, until it reaches the head of the queue.
// On any error, including ctx being done or the lease ending while waiting, it
// deletes its key before returning.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.acquire(ctx, req, true)
}

func (d *Driver) acquire(ctx context.Context, req driver.AcquireRequest, wait bool) (driver.Grant, error) {
	// start is when this call began; grants report their validity from the
	// last refresh of the lease (Grant.Sent), which may be later.
	start := time.Now()
	ops := queuelock.Ops[*handle]{
		Enqueue: func() (driver.Grant, error) { return d.enqueue(ctx, req, wait, start) },
		Check:   func(hd *handle) (bool, time.Time, error) { return d.stillHeld(ctx, hd) },
		Grant:   d.grant,
	}
	if req.LockDelay > 0 {
		ops.Reenter = func(hd *handle) error { return d.setGuard(ctx, hd, req.Name, req.LockDelay) }
	}
	return d.holds.Acquire(ctx, req.Name, req.Owner, wait, "etcdlock: acquire", ops)
}

// grant describes h. The lease was refreshed by a request sent at sent, so
// it lasts at least its TTL from then.
func (d *Driver) grant(h *handle, count int, sent time.Time) driver.Grant {
	return driver.Grant{
		Token:  uint64(h.rev),
		Count:  count,
		TTL:    h.sess.ttl,
		Sent:   sent,
		Handle: h,
		Lost:   h.sess.Done(),
		Cause:  h.sess.Cause,
	}
}

// stillHeld reports whether h's key exists with h's create revision, and
// when the lease was last known to be refreshed (see txnAlive).
func (d *Driver) stillHeld(ctx context.Context, h *handle) (bool, time.Time, error) {
	if h.sess.Lost() {
		return false, time.Time{}, nil
	}
	resp, sent, err := d.txnAlive(ctx, h.sess, d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)))
	if err != nil {
		if h.sess.Lost() {
			return false, sent, nil
		}
		return false, sent, fmt.Errorf("etcdlock: check key: %w", err)
	}
	return resp.Succeeded, sent, nil
}

// txnAlive commits txn and returns the send time of the last keepalive of
// sess's lease that the server confirmed: the lease lasts at least its TTL
// from then.
func (d *Driver) txnAlive(ctx context.Context, sess *session, txn clientv3.Txn) (*clientv3.TxnResponse, time.Time, error) {
	resp, err := txn.Commit()
	return resp, sess.RefreshedAt(), err
}

// enqueue puts the request's key and, when wait is set, waits for its turn.
func (d *Driver) enqueue(ctx context.Context, req driver.AcquireRequest, wait bool, start time.Time) (driver.Grant, error) {
	sess, err := d.session(ctx)
	if err != nil {
		return driver.Grant{}, err
	}
	key := d.keyFor(req.Name, req.Owner, sess.id)
	pfx := d.queuePrefix(req.Name)
	guard := d.guardKey(req.Name)
	resp, sent, err := d.txnAlive(ctx, sess, d.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, req.Owner, clientv3.WithLease(sess.id)), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...), clientv3.OpGet(guard)).
		Else(clientv3.OpGet(key), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...), clientv3.OpGet(guard)))
	if err != nil {
		// The put may have happened: remove whatever is there.
		d.discard(key, 0)
		return driver.Grant{}, queuelock.WrapCtx(ctx, "etcdlock: enqueue", err)
	}
	var rev int64
	if resp.Succeeded {
		rev = resp.Header.Revision
	} else {
		// Our key exists already: a put whose reply was lost, with this
		// driver's lease and this owner. Adopt it.
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || string(kvs[0].Value) != req.Owner {
			return driver.Grant{}, fmt.Errorf("etcdlock: key %q exists with another owner", key)
		}
		rev = kvs[0].CreateRevision
	}
	h := &handle{key: key, rev: rev, sess: sess}
	head := resp.Responses[1].GetResponseRange().Kvs
	first := len(head) == 0 || head[0].CreateRevision == rev
	if !first || blocked(resp.Responses[2].GetResponseRange().Kvs, key) {
		if !wait {
			d.discard(key, rev)
			return driver.Grant{}, &driver.LockedError{}
		}
		if sent, err = d.waitTurn(ctx, h, pfx, guard); err != nil {
			d.discard(key, rev)
			return driver.Grant{}, err
		}
	}
	if req.LockDelay > 0 {
		if err := d.setGuard(ctx, h, req.Name, req.LockDelay); err != nil {
			d.discard(key, rev)
			return driver.Grant{}, err
		}
	}
	return d.grant(h, 1, sent), nil
}

// waitTurn waits until no key older than h's remains under pfx and no
// lock-delay guard of an earlier holder remains. It returns the refresh time
// of the lease as of the look that found the way clear.
func (d *Driver) waitTurn(ctx context.Context, h *handle, pfx, guard string) (time.Time, error) {
	for {
		resp, sent, err := d.txnAlive(ctx, h.sess, d.cli.Txn(ctx).Then(
			clientv3.OpGet(h.key, clientv3.WithKeysOnly()),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(h.rev-1), clientv3.WithKeysOnly())...),
			clientv3.OpGet(guard),
		))
		if err != nil {
			if h.sess.Lost() {
				return sent, fmt.Errorf("etcdlock: while waiting: %w", h.sess.Cause())
			}
			return sent, queuelock.WrapCtx(ctx, "etcdlock: wait", err)
		}
		own := resp.Responses[0].GetResponseRange().Kvs
		if len(own) == 0 || own[0].CreateRevision != h.rev {
			if h.sess.Lost() {
				return sent, fmt.Errorf("etcdlock: while waiting: %w", h.sess.Cause())
			}
			return sent, fmt.Errorf("etcdlock: queue key %q was deleted while waiting: %w", h.key, driver.ErrSessionLost)
		}
		prev := resp.Responses[1].GetResponseRange().Kvs
		g := resp.Responses[2].GetResponseRange().Kvs
		var next *mvccpb.KeyValue
		switch {
		case len(prev) > 0:
			next = prev[0]
		case blocked(g, h.key):
			next = g[0] // an earlier holder was lost: wait out its lock-delay
		default:
			return sent, nil
		}
		if err := d.waitDelete(ctx, h.sess, string(next.Key), next.CreateRevision); err != nil {
			return sent, err
		}
	}
}

// waitDelete waits until the key created at revision createRev is gone.
//
// The watch starts at the current revision rather than at the revision of
// the caller's last read: etcd serves a watch that starts in the past from a
// background loop that catches up every 100ms, which would add up to 100ms to
// every hand-off on a busy lock. Once the watch exists, one read makes sure
// the key was not deleted before it.
func (d *Driver) waitDelete(ctx context.Context, sess *session, key string, createRev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := d.cli.Watch(wctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					return fmt.Errorf("etcdlock: wait: %w", ctx.Err())
				}
				if d.ctx.Err() != nil {
					return errors.New("etcdlock: driver is closed")
				}
				return nil // the watch ended: look again
			}
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					return nil // look again
				}
				return fmt.Errorf("etcdlock: watch %q: %w", key, err)
			}
			if wr.Created {
				resp, err := d.cli.Get(ctx, key, clientv3.WithKeysOnly())
				if err != nil {
					return queuelock.WrapCtx(ctx, "etcdlock: wait", err)
				}
				if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != createRev {
					return nil
				}
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		case <-sess.Done():
			return fmt.Errorf("etcdlock: while waiting: %w", sess.Cause())
		case <-ctx.Done():
			return fmt.Errorf("etcdlock: wait: %w", ctx.Err())
		case <-d.ctx.Done():
			return errors.New("etcdlock: driver is closed")
		}
	}
}

// discard deletes key (if its create revision is rev, or whatever version is
// there when rev is 0 and no local hold uses it) on a detached context. When
// that fails it keeps trying in the background while the lease lives, so an
// error path never leaves a live key blocking the queue.
func (d *Driver) discard(key string, rev int64) {
	if d.tryDiscard(key, rev) == nil {
		return
	}
	sess := d.currentSession()
	d.bg.Go(func() {
		delay := 50 * time.Millisecond
		for {
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(delay):
			}
			if sess != nil && sess.Lost() {
				return // the key went with the lease
			}
			if d.tryDiscard(key, rev) == nil {
				return
			}
			delay = min(2*delay, 2*time.Second)
		}
	})
}

func (d *Driver) currentSession() *session {
	d.smu.Lock()
	defer d.smu.Unlock()
	return d.sess
}

func (d *Driver) tryDiscard(key string, rev int64) error {
	ctx, cancel := context.WithTimeout(d.ctx, cleanupTimeout)
	defer cancel()
	if rev == 0 {
		resp, err := d.cli.Get(ctx, key, clientv3.WithKeysOnly())
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		rev = resp.Kvs[0].CreateRevision
		if d.inUse(key, rev) {
			return nil
		}
	}
	_, err := d.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit()
	return err
}

// inUse reports whether a local hold or a pending acquire may own key.
func (d *Driver) inUse(key string, rev int64) bool {
	return d.holds.Busy(func(h *handle) bool { return h.key == key && h.rev == rev })
}

// Release implements driver.Driver. The last release deletes the key in a
// transaction guarded by its create revision, so it never deletes a newer
// holder's key.
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
		return 0, queuelock.WrapCtx(ctx, "etcdlock: release", err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("etcdlock: key %q with revision %d is gone: %w", hd.key, hd.rev, driver.ErrNotHeld)
	}
	return 0, nil
}

// Renew implements driver.Driver. The lease is kept alive by the driver's
// own keepalive loop; Renew proves it alive and every key still in place with one
// KeepAliveOnce per lease in the batch and one read-only transaction per 128
// keys, all sent at once (one round trip of latency).
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
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
	var wg sync.WaitGroup
	var mu sync.Mutex
	list := make([]*session, 0, len(sessions))
	for s := range sessions {
		list = append(list, s)
	}
	for _, s := range list {
		wg.Go(func() {
			err := d.refresh(ctx, s)
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
			case c.err != nil:
				errs[i] = fmt.Errorf("etcdlock: renew: %w", c.err)
				failed++
				firstErr = c.err
			case !present(c.resp.Responses[j].GetResponseRange().Kvs, hd.rev):
				errs[i] = fmt.Errorf("etcdlock: key %q is gone: %w", hd.key, driver.ErrNotHeld)
				if ls[i].LockDelay > 0 {
					d.armGuard(ctx, hd, ls[i].Name, ls[i].LockDelay)
				}
			case serr != nil:
				errs[i] = fmt.Errorf("etcdlock: keep lease alive: %w", serr)
				failed++
				firstErr = serr
			}
		}
	}
	if failed == len(ls) {
		return nil, queuelock.WrapCtx(ctx, "etcdlock: renew", firstErr)
	}
	return errs, nil
}

func present(kvs []*mvccpb.KeyValue, rev int64) bool {
	return len(kvs) == 1 && kvs[0].CreateRevision == rev
}

// Close implements driver.Driver: it stops the lease keepalive and revokes the
// lease, which deletes any key still bound to it. It closes the etcd client
// only when the driver opened it (through a URL).
func (d *Driver) Close() error {
	d.stop()
	var err error
	if s := d.currentSession(); s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		for _, id := range append(s.delayLeases(), s.id) {
			if _, rerr := d.cli.Revoke(ctx, id); rerr != nil && !errors.Is(rerr, rpctypes.ErrLeaseNotFound) && err == nil {
				err = fmt.Errorf("etcdlock: revoke lease %x: %w", int64(id), rerr)
			}
		}
		cancel()
	}
	if d.ownsClient {
		if cerr := d.cli.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// stop ends the driver's background work without revoking anything.
func (d *Driver) stop() { d.bg.Stop() }
