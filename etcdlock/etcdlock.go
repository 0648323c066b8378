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
// A driver owns one etcd lease (a session) per distinct lock TTL, granted on
// first use of that TTL and kept alive by one keepalive loop per lease (see
// "Keepalives" below). Every lock the driver takes is a key
//
//	<prefix><name>/<lease ID in hex>-<slot number in hex>
//
// bound to the lease of the lock's TTL and put, only if absent, in a
// transaction that also reads the key with the lowest create revision under
// <prefix><name>/. The slot is the lowest one of that lease on that name not
// in use (usually 0), so the grants of one lease on one name reuse one key
// and etcd's index does not grow with every Lock (see slots.go). The key with the lowest
// create revision holds the lock; the others are its queue, in arrival order.
// A waiter watches only the key just before its own (no herd) and looks again
// after that key is deleted. The fencing token is the key's create revision,
// which etcd makes strictly increasing across the whole cluster.
//
// With an empty prefix this is the layout of etcd's own concurrency.Mutex and
// of `etcdctl lock`: a dlock lock on name X and concurrency.NewMutex(s, "X")
// or `etcdctl lock X` exclude each other, for every name, those with '/'
// included (the name is the key verbatim). The queue prefix of "a" also
// holds the keys of "a/b"; dlock skips keys with a '/' or NUL after the
// prefix (see inQueue), so the lock "a" never waits for "a/b". etcd's
// concurrency.Mutex does not skip them: its "a" waits while "a/b" is held,
// dlock's or its own.
//
// # Sessions, TTL and loss
//
// A grant lives as long as its lease. The lease has the TTL the request asked
// for, rounded up to whole seconds (etcd's unit; the driver's Limits say so,
// and the dlock package rounds before it asks): the locks of one driver with
// the same TTL share one lease, a lock with another TTL gets a lease of its
// own. The etcd server raises a TTL below its minimum (1.5 election timeouts,
// 2s with etcd's default settings); Grant.TTL is always the TTL the server
// granted, counted from Grant.Sent, the send time of the last keepalive of
// the lease that the server confirmed. When a lease ends (the server no
// longer knows it, or no keepalive was confirmed for a whole TTL), the Lost
// channel of every grant on that lease, and of no other, closes with a cause
// wrapping driver.ErrSessionLost, and a waiter whose lease ends while waiting
// returns an error at once rather than waiting on a key that no longer exists
// (etcd issue 19597). Later locks with that TTL get a new lease. A holder that
// disappears without releasing (a crash, a cut connection) keeps its locks
// for at most their TTL after its last confirmed keepalive, plus their
// lock-delay. Choose a TTL well above the cluster's election time, or a
// leader change ends the lease.
//
// Since a lease is shared and kept alive by the driver, a grant that nobody
// renews would otherwise live as long as the driver: so, as the driver
// contract has it, a grant lives its TTL without renewal. The driver deletes
// the key of a grant that no TTL-long stretch has confirmed (by the acquire,
// a re-entry or Renew), as if its lease had expired, lock-delay included
// (see reap.go). The dlock package renews every TTL/3 and has given such a
// lease up before then.
//
// A lease's TTL is fixed when it is granted, so Renew (the dlock package's
// Extend) cannot move a lock to another TTL: a Renew whose Lease.TTL is
// neither the TTL the lock asked for nor the one granted fails for that lock
// with an error wrapping driver.ErrUnsupported, and the lock keeps its TTL.
//
// Release deletes the key only if its create revision still equals the
// grant's token, so a retried or stale release can never delete a newer
// holder's key (etcd issue 22082). A slot stays in use until its key is
// known to be gone, so an acquire never adopts a key left by an earlier
// grant or attempt whose release has an unknown outcome, and a key put again
// at a freed slot has a new create revision: a release retried after an
// unknown outcome cannot delete a later grant of the same owner either. A Release is safe to repeat:
// it deletes the grant's key if it is still there, and otherwise returns
// driver.ErrNotHeld without touching anything. A cancelled or failed Acquire
// deletes its own queue key before it returns.
//
// Re-entrance is per driver: the same owner taking the same name again on the
// same driver increments a hold count kept by the driver (the grant keeps
// the TTL of its first acquire). The same owner string used through another
// driver (another process) has another key and queues like any other owner.
//
// Lock-delay is supported through a guard key per lock (see delay.go): a
// holder that ends without a release keeps the lock unavailable for its
// LockDelay after its lease expired; a release frees it at once.
//
// # Read/write locks and semaphores
//
// A name's read/write lock and semaphore are queues of their own beside the
// mutex's, <prefix><name>\x00rw/ and <prefix><name>\x00sem/, bound to the
// same leases and granted in create-revision order: a reader once no older
// writer key remains, a writer once no older key remains (so a waiting
// writer holds back later readers), a permit once fewer than its semaphore's
// permits older keys remain. Each waiter watches only the key it must wait
// for. The permit count is stored in every key of the semaphore; a request
// with another count is refused with ErrInvalid while any key remains.
// Tokens are the revision of the grant. Lock-delay applies per holder. See
// kinds.go.
//
// # Keepalives
//
// Each lease has one loop that sends all its keepalives (KeepAliveOnce, so
// the driver measures the TTL from each keepalive's send time rather than
// from its reply, as the client library's KeepAlive would). Left alone it
// sends one every TTL/3. The dlock package's renewal (Renew, every TTL/3)
// does not send keepalives of its own: it asks the lease's loop for one sent
// after the Renew call began (concurrent calls share it), because the dlock
// package counts the lease's validity from its call, and it reads every
// renewed key in the same round trip, because a key can be deleted while its
// lease lives. After a keepalive a Renew asked for, the loop waits a little
// longer than TTL/3 before sending one on its own, so a renewed lease costs
// one keepalive per renewal.
//
// # Guarantees
//
// Mutual exclusion holds as far as etcd's linearizable reads and writes do:
// every decision is made on a quorum-committed revision. A holder cut off from
// the cluster gives a lease up one granted TTL after the send time of its
// last confirmed keepalive, no later than the server expires it; a holder
// paused past that point is stopped only by the fencing token.
package etcdlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock"
)

// DefaultSessionTTL is the lease TTL of a request that carries no TTL
// (driver.AcquireRequest.TTL zero) when Options.SessionTTL is zero.
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
	// SessionTTL is the lease TTL of a request that carries no TTL
	// (driver.AcquireRequest.TTL zero), rounded up to whole seconds. The
	// dlock package always sends the lock's TTL, which is then the lease's
	// TTL: SessionTTL does not change it. Default DefaultSessionTTL. URL:
	// session_ttl.
	//
	// Deprecated: every lock's lease has the lock's own TTL (set it with
	// dlock.Options.TTL, MutexOptions.TTL or the URL's ttl parameter). A
	// driver used to have one lease of this TTL for all its locks.
	SessionTTL time.Duration
}

// Driver is a dlock driver over an etcd client. It implements driver.Driver,
// driver.Queuer, driver.Inspector, driver.Limiter and driver.Kinder
// (read/write locks and semaphores, see kinds.go). It is safe for
// concurrent use. Create it with New or OpenURL.
type Driver struct {
	cli        *clientv3.Client
	ownsClient bool
	prefix     string
	ttlSeconds int64 // of a request without a TTL

	bg  *sessionlock.Group
	ctx context.Context // bg's: cancelled by Close

	smu      sync.Mutex         // serialises lease grants; guards sessions
	sessions map[int64]*session // the live lease of each requested TTL (whole seconds)

	holds sessionlock.Holds[*handle] // re-entrance by (name, owner)

	// testCheck, set only by tests before first use, replaces the outcome
	// ok of a re-entry or nested-release check of h (to make it wrong).
	testCheck func(h *handle, ok bool) bool
}

var (
	_ driver.Driver  = (*Driver)(nil)
	_ driver.Queuer  = (*Driver)(nil)
	_ driver.Limiter = (*Driver)(nil)
)

// handle is the Grant.Handle of this driver.
//
// The driver keeps one per held grant, so it is kept small (80 bytes, a
// size class; TestHandleSize): what can be derived from its fields is (its
// lock name: name, a part of its key; its slot's name: slotName; its lock-
// delay guard key: Driver.guardOf; whether it wrote a guard: delay > 0).
type handle struct {
	key   string
	sess  *session
	next  *handle      // the next handle of the same slot name on sess (see slots.go); guarded by sess.mu
	rev   int64        // the key's create revision
	token int64        // the grant's token: rev, or the revision of the write that marked a waited grant (see touch)
	delay atomic.Int64 // the lock-delay of the guard written, a time.Duration; 0: no guard was written

	confirmed sessionlock.Stamp // send time of the last request that proved the grant (see reap.go)

	slot    uint32 // the key's slot (see slots.go)
	pending int32  // plain deletes of the key sent by Release and not answered; guarded by sess.mu
	nameEnd uint32 // the lock name is key[len(prefix):nameEnd]
	kind    driver.Kind

	// Guarded by sess.mu (see slots.go):
	stale bool // a plain delete of the key has an unknown outcome
	freed bool // the key's slot was freed
	held  bool // a grant returned and not yet released (see reap.go)
}

// newHandle returns the handle of a new key of kind k for name on sess, at
// the lowest slot of that name on sess not in use (see slots.go), which it
// takes.
func (d *Driver) newHandle(k driver.Kind, name string, sess *session) *handle {
	h := &handle{kind: k, sess: sess, nameEnd: uint32(len(d.prefix) + len(name))}
	sess.takeSlot(name, h, func(n uint32) string {
		if k == driver.Exclusive {
			return d.slotKey(name, sess.id, n)
		}
		return d.kindKey(k, name, sess.id, n)
	})
	return h
}

// name is the lock name of h.
func (h *handle) name() string { return h.key[h.sess.prefixLen:h.nameEnd] }

// guarded reports whether a lock-delay guard of h was written.
func (h *handle) guarded() bool { return h.delay.Load() > 0 }

// slotName is the name h's slot is recorded under (see slots.go):
// sessionlock.HoldName(kind, name).
func (h *handle) slotName() string { return sessionlock.HoldName(h.kind, h.name()) }

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
	secs := seconds(o.SessionTTL)
	bg := sessionlock.NewGroup()
	return &Driver{
		cli:        cli,
		ownsClient: owns,
		prefix:     o.Prefix,
		ttlSeconds: secs,
		bg:         bg,
		ctx:        bg.Context(),
	}, nil
}

// queuePrefix is the key prefix under which name's queue lives: the name
// verbatim, as etcd's concurrency.Mutex and `etcdctl lock` key it, so a
// name with '/' is shared with them too. The prefix of a name "a" also
// holds the keys of the names nested below it ("a/b", "a/b/c"): see
// inQueue.
func (d *Driver) queuePrefix(name string) string {
	return d.prefix + name + "/"
}

// inQueue reports whether key, found under the queue prefix pfx, is a key
// of that queue: one whose rest after pfx holds no '/' (a nested name's
// queue key) and no NUL (a nested name's guard or read/write lock or
// semaphore key). Queue keys end in a lease ID in hex (and dlock's slot).
func inQueue(pfx string, key []byte) bool {
	return len(key) > len(pfx) && !bytes.ContainsAny(key[len(pfx):], "/\x00")
}

// slotKey is the queue key of slot n of name under lease id.
func (d *Driver) slotKey(name string, id clientv3.LeaseID, n uint32) string {
	return leaseKey(d.prefix, name, "/", "", id, n)
}

// leaseKey is the key a+b+c+e+"<id in hex>-<n in hex>", made in one
// allocation of its length.
func leaseKey(a, b, c, e string, id clientv3.LeaseID, n uint32) string {
	var num [32]byte
	tail := strconv.AppendInt(num[:0], int64(id), 16)
	tail = append(tail, '-')
	tail = strconv.AppendUint(tail, uint64(n), 16)
	var sb strings.Builder
	sb.Grow(len(a) + len(b) + len(c) + len(e) + len(tail))
	sb.WriteString(a)
	sb.WriteString(b)
	sb.WriteString(c)
	sb.WriteString(e)
	sb.Write(tail)
	return sb.String()
}

// Limits implements driver.Limiter: etcd lease TTLs are whole seconds.
func (d *Driver) Limits() driver.Limits {
	return driver.Limits{TTLGranularity: time.Second}
}

// Close implements driver.Driver: it stops the lease keepalives and revokes
// every lease, which deletes any key still bound to one. It closes the etcd
// client only when the driver opened it (through a URL).
func (d *Driver) Close() error {
	d.stop()
	var err error
	ss := d.liveSessions()
	if len(ss) > 0 && d.cli.Ctx().Err() != nil {
		// The user closed the client first: a revoke would only spin in the
		// client's retries. The leases expire on their own.
		err = fmt.Errorf("etcdlock: close: the etcd client is closed: %d leases left to expire", len(ss))
		ss = nil
	}
	if len(ss) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		for _, s := range ss {
			for _, id := range append(s.delayLeases(), s.id) {
				if _, rerr := d.cli.Revoke(ctx, id); rerr != nil && !errors.Is(rerr, rpctypes.ErrLeaseNotFound) && err == nil {
					err = fmt.Errorf("etcdlock: revoke lease %x: %w", int64(id), rerr)
				}
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
