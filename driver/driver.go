// Package driver defines the interfaces a dlock backend implements.
//
// User code talks to the dlock package (Client, Mutex, Lease); the dlock
// package talks to a Driver. The split follows database/sql:
//
//	user code → dlock (concrete types) → dlock/driver (interfaces)
//
// A driver does one thing well: atomic round trips against its backend. It
// does not retry, back off, wait in a loop, schedule renewals, keep validity
// deadlines, validate names or options, or wrap its errors for users: the
// dlock package does all of that once, for every backend.
//
// # The contract
//
// Every method must be safe for concurrent use and must honour its context:
// when ctx is done the method returns promptly with an error that wraps
// ctx.Err(). Mutating calls (TryAcquire, Release, Renew) must be atomic on the
// server: either they take effect completely or not at all, and their result
// says which. When a call's outcome is unknown (the request was sent but the
// reply was lost), the driver returns an ordinary error; the dlock package
// treats the lease as possibly held and releases it on a best-effort basis.
//
// Time that decides expiry is the backend's own (Redis TIME/PX, SQL now(),
// etcd and ZooKeeper sessions). A driver never compares its local wall clock
// with a server's.
//
// Every grant carries an owner string chosen by the caller. The backend stores
// it with the lock and checks it atomically in Release and Renew, so a stale
// caller can never release or extend a newer holder's lock. A TryAcquire by an
// owner that already holds the lock re-enters it: the hold count goes up by
// one, the fencing token stays the same, and the TTL is reset.
//
// Every grant carries a fencing token: a uint64 strictly greater than every
// token granted before for that name on that backend, including to holders
// that crashed. Re-entering does not change the token.
//
// Lock-delay (Chubby): when a holder's lease ends without a release (it
// expired, or its session was lost), the lock stays unavailable for the
// holder's AcquireRequest.LockDelay beyond the expiry. A Release frees the lock
// at once. A driver that cannot honour LockDelay > 0 returns an error wrapping
// ErrUnsupported from TryAcquire.
//
// # Optional capabilities
//
// A driver may also implement Notifier (waiters are woken by the server when
// a lock is released), Queuer (the backend queues waiters natively, in order;
// with QueueChooser, only some requests),
// Inspector (list locks for status output), NameChecker (backend-specific name
// rules), Limiter (TTL bounds), Kinder (read/write locks and semaphores, with
// Withdrawer for writer preference), MultiAcquirer (several mutexes in one
// atomic round trip) and FenceRaiser (the quorum lock's token rule). The dlock package finds them by type
// assertion, as database/sql finds driver.Pinger.
package driver

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors shared by drivers and the dlock package. The dlock package
// re-exports them under the same names; errors.Is works through every wrap.
var (
	// ErrLocked means the lock is held by another owner (or is inside its
	// lock-delay). Drivers may return a *LockedError to add a retry hint.
	ErrLocked = errors.New("dlock: lock is held")
	// ErrNotHeld means the caller's owner does not hold the lock: it was
	// released, expired, or taken over by another holder.
	ErrNotHeld = errors.New("dlock: lock is not held by this owner")
	// ErrUnsupported means the backend cannot honour a requested option.
	ErrUnsupported = errors.New("dlock: not supported by this backend")
	// ErrInvalid means an argument was bad input: a malformed URL, an
	// unknown URL parameter, a value out of range. A driver wraps it for
	// input it refuses (URL openers build such errors with the internal
	// openurl package); dlock.Open then reports an *InvalidArgumentError
	// and the dlock command exits 64 rather than "backend unavailable".
	ErrInvalid = errors.New("dlock: invalid argument")
	// ErrSessionLost means the session the grant was bound to has ended
	// (an etcd lease expired, a ZooKeeper session expired, a pinned SQL
	// connection died). Every grant bound to it is gone.
	ErrSessionLost = errors.New("dlock: backend session lost")
)

// LockedError is returned by TryAcquire when the lock is held by someone
// else. It wraps ErrLocked.
type LockedError struct {
	// RetryAfter is how long until the lock can be taken at the earliest if
	// nobody releases it: the holder's remaining TTL plus any lock-delay, as
	// the backend measured it. Zero means unknown.
	RetryAfter time.Duration
	// Token is the current holder's fencing token, zero if unknown.
	Token uint64
}

func (e *LockedError) Error() string { return ErrLocked.Error() }

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// AcquireRequest describes one attempt to take a lock. The dlock package has
// validated every field before a driver sees it.
type AcquireRequest struct {
	// Name is the lock's name: 1 to 255 bytes of valid UTF-8 with no control
	// characters. A driver maps it onto its key space (escaping or hashing as
	// it must) in a way that never lets two different names collide.
	Name string
	// Owner identifies the holder: 1 to 128 bytes of printable ASCII. A
	// request whose Owner holds the lock already re-enters it.
	Owner string
	// TTL is how long the grant lives without renewal: at least 10ms (the
	// dlock package's floor) and at least the driver's Limits.MinTTL, rounded
	// up to its Limits.TTLGranularity. Session-bound drivers may use their
	// session's TTL instead and report it in Grant.TTL.
	TTL time.Duration
	// LockDelay keeps the lock unavailable this long after the grant ends
	// without a release (expiry, session loss). Zero means none.
	LockDelay time.Duration
	// Kind is the sort of lock (see Kind); zero is a mutex. Drivers that do
	// not implement Kinder only ever see zero.
	Kind Kind
	// Permits is the semaphore's size when Kind is Permit (at least 1),
	// zero otherwise. The backend stores it with the semaphore; while any
	// permit is held (or kept by a lock-delay) a request whose Permits
	// differs from the stored count fails with an error wrapping ErrInvalid
	// that names both counts, and changes nothing. A request to an idle
	// semaphore (no permit held or delayed) is granted and stores its own
	// count, so a semaphore can be resized once its holders have stopped.
	Permits int
	// Waiting is set when the caller will keep trying until granted (a
	// waiting Lock of a mutex or a write lock), not for a one-shot TryLock.
	// A refused Write request with Waiting set records the waiting writer
	// (see Withdrawer). For a mutex it is a hint: a driver may tell the
	// attempts of a waiter it refused (the same Name and Owner, answering
	// a wake-up) from a new Lock, and hold back only the latter after a
	// contended release (a stand-back); a mutex waiter is never withdrawn.
	Waiting bool
}

// Grant is a successful TryAcquire or Acquire.
type Grant struct {
	// Token is the fencing token (see the package doc). Never zero.
	Token uint64
	// Count is the hold count after this acquire: 1 for a new grant, more
	// when the owner re-entered.
	Count int
	// TTL is the lease time the backend actually granted, measured from
	// Sent. Zero means the requested TTL.
	TTL time.Duration
	// Sent, if not zero, is when the request that last confirmed this
	// grant's lease was sent, read from time.Now (so with its monotonic
	// reading). Drivers whose grants live on a shared session set it to the
	// send time of the keepalive or check that last proved the session
	// alive: later than the call after a long queue wait, earlier than the
	// call when the session was last refreshed before it (the server counts
	// the lease from that refresh, not from the acquire). The dlock package
	// measures the lease's validity from Sent whichever way it falls. Zero
	// means when TryAcquire or Acquire was called.
	Sent time.Time
	// Key names where the backend keeps this grant, for operators and
	// logs: the etcd key, the ZooKeeper node path, the Redis key, the lock's
	// name in a SQL table. Empty when the driver does not say. It is not
	// used to release or renew the grant (Handle is). "dlock run" hands it
	// to CMD as DLOCK_KEY, as etcdctl lock prints its key.
	Key string
	// Handle is driver-private state for this grant (a key, a node path, a
	// pinned connection). The dlock package hands it back unchanged in
	// Lease.Handle for Release and Renew, and never looks inside.
	Handle any
	// Lost, if not nil, is closed by the driver when it learns that the
	// grant is gone without being asked (a session expired, a pinned
	// connection died). After it closes, Cause reports why. A driver that
	// cannot tell leaves both nil; loss is then found by Renew.
	Lost <-chan struct{}
	// Cause returns the reason once Lost is closed. It must wrap
	// ErrSessionLost or ErrNotHeld.
	Cause func() error
}

// Lease identifies a grant in Release and Renew calls. It is the driver's
// view of one grant (name, owner, token, handle), not the user's
// dlock.Lease, which the dlock package builds around it and which carries
// the validity deadline, renewal and loss signalling.
//
// Release may be called with Token 0 and a nil Handle: the dlock package does
// that to clean up after a TryAcquire whose outcome is unknown (the reply was
// lost or the context ended mid-request), always with a fresh random Owner
// that nobody else uses. The driver then releases whatever that owner holds
// on Name, or returns ErrNotHeld.
type Lease struct {
	Name   string
	Owner  string
	Token  uint64
	Handle any
	// TTL is the lease time to set from now (Renew) or the TTL of the
	// original grant (Release).
	TTL time.Duration
	// LockDelay is the lock-delay of the original grant.
	LockDelay time.Duration
	// Kind and Permits are those of the original request.
	Kind    Kind
	Permits int
}

// Driver is the interface every backend implements.
type Driver interface {
	// TryAcquire makes one attempt to take or re-enter the lock. It returns
	// a Grant, or an error wrapping ErrLocked when another owner holds it
	// (or it is within a lock-delay), or any other error when the attempt
	// failed. It never waits for the lock to be released.
	TryAcquire(ctx context.Context, req AcquireRequest) (Grant, error)

	// Release gives up one hold of the lock by l.Owner. It returns the hold
	// count that remains (0 when the lock is now free, and free at once with
	// no lock-delay), or an error wrapping ErrNotHeld when l.Owner does not
	// hold the lock (wrapping ErrSessionLost as well when the grant went
	// with its session). A Release never affects another owner's grant.
	//
	// A lease that the dlock package ends because its validity deadline
	// passed unconfirmed (a paused process, renewals that failed) is not
	// released through the driver: the backend expires it. A driver that
	// keeps local state per grant (a pinned connection, a re-entry record)
	// must therefore end that state on its own once the grant's TTL has run
	// out since its last confirmation, or it answers later acquires from a
	// grant the server no longer has.
	Release(ctx context.Context, l Lease) (remaining int, err error)

	// Renew extends every lease in ls to its TTL from now, in as few round
	// trips as the backend allows (one per connection is the aim). errs has
	// one entry per lease: nil when renewed; an error wrapping ErrNotHeld
	// when that lease is gone (it will never come back); an error wrapping
	// ErrSessionLost (and, preferably, ErrNotHeld too) when it is gone
	// because its session ended (an etcd lease, a ZooKeeper session, a
	// pinned SQL connection); or another error when its fate is unknown.
	// The dlock package ends a lease at once on ErrNotHeld or
	// ErrSessionLost, and retries the others until the lease's validity
	// deadline. A non-nil err means no lease could be renewed and all fates
	// are unknown; errs is then ignored.
	Renew(ctx context.Context, ls []Lease) (errs []error, err error)

	// Close releases the driver's own resources (connections, sessions,
	// goroutines). The dlock package has released every lease it knew of
	// before calling Close, but a TryAcquire or Acquire may still be in
	// flight: a driver must not leave such a late grant held on the server
	// past Close when it can help it (it refuses calls once Close starts,
	// and releases grants that completed meanwhile before closing its
	// connections), and never returns a grant to a caller after Close has
	// begun. Locks still held may also be freed as a side effect (a closed
	// ZooKeeper session deletes its nodes, a revoked etcd lease its keys).
	// Close must not close a client the user passed to the driver's
	// constructor; such a driver only stops what it started itself.
	Close() error
}

// Notifier is implemented by drivers whose backend tells waiters when a lock
// is released (Redis pub/sub, PostgreSQL LISTEN/NOTIFY).
type Notifier interface {
	// Subscribe starts listening for releases of name. The dlock package
	// subscribes once a TryAcquire has returned ErrLocked (so an
	// uncontended Lock costs one round trip), then tries again at once
	// before it waits: a release between the failed attempt and the
	// subscription is not missed. A Subscribe error only makes it poll.
	Subscribe(ctx context.Context, name string) (Subscription, error)
}

// Subscription delivers release notifications for one name.
type Subscription interface {
	// C receives a value (coalesced, never blocking the sender) after the
	// lock may have become free.
	C() <-chan struct{}
	// Close stops the subscription. It is safe to call more than once.
	Close() error
}

// Queuer is implemented by drivers whose backend keeps a fair queue of
// waiters (etcd revisions, ZooKeeper sequential nodes). The dlock package
// calls Acquire instead of looping over TryAcquire.
type Queuer interface {
	// Acquire enqueues the request and blocks until it is granted, ctx is
	// done, or an error occurs. On any error return it must leave nothing
	// behind on the server: no queue entry, no orphan key or node. When ctx
	// is done it returns an error wrapping ctx.Err().
	Acquire(ctx context.Context, req AcquireRequest) (Grant, error)
}

// QueueChooser is implemented by a Queuer that queues only some requests:
// a session-bound SQL mode whose server can keep a session waiting for a
// mutex (pg_advisory_lock) but not for its other kinds, or only while its
// pool has connections to spare for waiters. The dlock package asks Queues
// once per waiting Lock, before its first attempt. When it reports true,
// the first attempt is a TryAcquire (an uncontended Lock costs what a
// TryLock does) and a refused one is followed by Acquire, which waits;
// otherwise the Lock loops over TryAcquire as for a driver without Queuer.
// Queues must not block or do I/O.
type QueueChooser interface {
	Queues(req AcquireRequest) bool
}

// LockInfo describes one lock, for status output.
type LockInfo struct {
	Name  string
	Owner string // empty when the lock is free
	Token uint64 // the last token granted
	Count int    // hold count, 0 when free
	// ExpiresIn is the remaining TTL of the holder; negative when unknown
	// (session-bound), zero when free.
	ExpiresIn time.Duration
	// Waiters is the number of queued waiters, or -1 when unknown.
	Waiters int
	// Kind is the lock's sort: Exclusive for a mutex, Write for a
	// read/write lock (whether it is held for reading or writing, see
	// Readers), Permit for a semaphore. A name used with several kinds has
	// one LockInfo per kind.
	Kind Kind
	// Readers is, for a read/write lock, the number of read holders (Owner
	// is then empty unless a writer holds it). Zero otherwise.
	Readers int
	// Permits and Holders are, for a semaphore, its size and the number of
	// permits taken. Zero otherwise.
	Permits int
	Holders int
}

// Inspector is implemented by drivers that can list locks.
type Inspector interface {
	// Inspect lists locks whose names start with prefix, sorted by name.
	Inspect(ctx context.Context, prefix string) ([]LockInfo, error)
}

// Breaker is implemented by drivers whose grants live in a client's own
// session (etcd, ZooKeeper), which another client cannot end through
// Release, but whose backend lets any client remove a grant. It serves an
// operator's break-glass ("dlock release --force").
type Breaker interface {
	// Break ends the mutex grant of name whose fencing token is token,
	// whoever holds it (a foreign client's too), atomically on the server:
	// only if that grant still holds the lock, so a newer holder is never
	// touched. It returns an error wrapping ErrNotHeld when the lock is
	// free or held by another grant. The holder learns of it at its next
	// renewal or through its loss notification; no lock-delay follows.
	Break(ctx context.Context, name string, token uint64) error
}

// NameChecker is implemented by drivers with rules for names beyond the
// dlock package's own. CheckName returns an error describing what is wrong.
type NameChecker interface {
	CheckName(name string) error
}

// Limits bounds the options a backend can honour.
type Limits struct {
	// MinTTL is the shortest TTL the backend grants; the dlock package
	// refuses shorter requests as invalid before the driver sees them. Zero
	// means no floor beyond the dlock package's own 10ms.
	MinTTL time.Duration
	// TTLGranularity: TTLs are rounded up to a multiple of it. Zero means
	// exact.
	TTLGranularity time.Duration
}

// Limiter is implemented by drivers that have Limits.
type Limiter interface {
	Limits() Limits
}

// Quiescer is implemented by drivers whose client keeps something on the
// backend that blocks other clients for as long as one of its statements
// runs, such as the write lock of a SQLite file, held by a writing process
// even while that process is stopped (SIGSTOP, Ctrl-Z). A program about to
// stop itself quiesces the driver first, so that it stops holding nothing
// that other clients wait on.
type Quiescer interface {
	// Quiesce blocks every new backend statement of the driver (they wait,
	// or end with their own context) and waits for the running ones to
	// finish. On success it returns resume, which lets the blocked
	// statements go; calling resume more than once does nothing. If ctx
	// ends first, Quiesce lets the blocked statements go and returns an
	// error wrapping ctx.Err() (resume is nil). Quiesce is safe for
	// concurrent use: a second Quiesce waits for the first one's resume.
	// A statement does not hold the driver open across a Quiesce, so
	// waits and renewals never deadlock with it; they are only delayed
	// until resume.
	Quiesce(ctx context.Context) (resume func(), err error)
}
