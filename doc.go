// Package dlock provides distributed locks with fencing tokens, leases that
// renew themselves, loss that is never silent, and waiters woken by the
// backend, on whichever store a team already runs: an SQLite file, Redis, a
// Redlock set of independent Redis masters, etcd, ZooKeeper, PostgreSQL or
// MySQL/MariaDB.
//
//	client, err := dlock.Open(ctx, "sqlite:///var/lib/app/locks.db")
//	defer client.Close()
//	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
//	defer lease.Unlock(context.Background())
//	doWork(lease.Context(), lease.Token())
//
// A backend is chosen by URL scheme; import its package for the side effect
// (sqlitelock, redislock, redlock, etcdlock, zklock, pglock, mysqllock,
// memlock), or build a driver from your own client with the package's New
// and pass it to New here.
//
// # Guarantees
//
// Mutual exclusion among live holders, as far as the backend's own
// consistency carries it: exact on one SQLite file, one Redis node, one SQL
// primary, and an etcd or ZooKeeper ensemble; for Redlock, only under its
// timing assumptions (bounded clock drift and pauses). docs/backends.md says
// exactly how far for each backend, and what failover does.
//
// No deadlock: a holder that crashes or is cut off loses the lock after its
// TTL (or session timeout), plus its lock-delay if it set one. Unlock frees
// the lock at once.
//
// Owner-only release: every grant carries an owner (by default a random
// 128-bit token from crypto/rand), checked atomically by the backend. A stale
// Unlock or Extend never touches a newer holder's lock.
//
// Fencing: Lease.Token is strictly greater than every token granted before
// for that name on that backend, across holders and crashes. A resource that
// remembers the highest token it accepted (package fence) can refuse a
// holder that paused past its lease and does not know it yet. Locks alone
// cannot give that guarantee; tokens can.
//
// Loss is never silent: when renewal cannot prove a lease is still held
// before its local validity deadline — measured on the monotonic clock from
// when the acquire request was sent, minus a drift margin — Lease.Done closes,
// Lease.Context is cancelled and Lease.Err wraps ErrLeaseLost with the cause.
// The deadline falls before the backend can expire the lease, so a holder
// learns of loss before anyone else can be granted the lock.
//
// Time that decides expiry is the backend's (Redis TIME and PX, SQL now(),
// etcd and ZooKeeper sessions), never a comparison of two machines' clocks.
//
// # Lock types
//
// Besides the Mutex, a Client hands out three more lock types, with the
// Mutex's guarantees (leases that renew themselves, loss never silent,
// fencing tokens, lock-delay, owner-only release):
//
//   - RWMutex (NewRWMutex): any number of readers (RLock) or one writer
//     (Lock). Writer preference: once a writer waits, new readers wait
//     behind it, so writers never starve. Every grant, read or write,
//     carries a token above every earlier grant of the name's RWMutex.
//   - Semaphore (NewSemaphore): at most N holders (Acquire). Holders must
//     agree on N while the semaphore is in use; a different N is refused
//     with ErrInvalid.
//   - MultiMutex (NewMultiMutex): the Mutexes of several names, all or
//     none, taken in sorted order so that overlapping sets never deadlock.
//     Its MultiLease is lost when any part is.
//
// The Mutex, the RWMutex and the Semaphore of one name are three different
// locks. A backend that has no read/write locks or semaphores (its driver
// lacks driver.Kinder for them) refuses them with ErrUnsupported rather
// than handing out a mutex instead.
//
// # Waiting
//
// Lock waits for the lock. Backends that can notify (Redis pub/sub,
// PostgreSQL LISTEN/NOTIFY) wake waiters on release; etcd and ZooKeeper
// queue waiters in order and each watches only its predecessor. Elsewhere
// Lock retries with jittered exponential backoff (Options.WaitMin, WaitMax),
// never sleeping past the moment the holder's lease runs out.
//
// A waiting Lock rides out backend failures: a failed attempt is logged and
// retried with the same backoff until ctx ends, and the error then wraps both
// ctx.Err() and the last backend error. Options.FailFast (URL fail_fast=true)
// or MutexOptions.FailFast return the first backend error instead. TryLock
// always makes exactly one attempt.
//
// # Unlock
//
// Unlock frees the lock at once. When its outcome is unknown (the backend
// could not be reached, the reply was lost) Unlock returns the error, and the
// Client keeps retrying the release in the background until the backend
// confirms it, the grant's session ends, the lease has certainly expired, or
// Close (which makes a last attempt), so that no live session keeps a lock
// its owner gave up. Releases of leases with an explicit MutexOptions.Owner
// are not retried: with re-entrance, a repeated release could give up
// another hold of the same owner.
//
// # Observability
//
// Options.Logger (a log/slog logger) receives what the library does in the
// background: a renewal that fails, or stays unanswered for a renewal
// interval, at Warn, with the attempt and the time left before the lease's
// validity deadline, while the lease can still be saved; a loss at Error
// with its cause; every record names the backend, the lock and its token.
// Options.Hooks sees every operation, attempt, grant, renewal and loss:
// package dlockprom turns them into Prometheus metrics and dlockotel into
// OpenTelemetry spans and metrics. OpenWith opens a URL with both set.
//
// # Errors
//
// errors.Is tells the outcomes apart through every wrap: ErrLocked (held by
// someone else), ErrNotHeld, ErrLeaseLost, ErrClosed, ErrUnsupported, a
// context's error, and ErrInvalid for bad input (an *InvalidArgumentError
// naming the argument: a lock name, an option, or a URL a driver refused).
// Any other backend failure is an *OpError wrapping the driver's error.
// No error Open returns, and nothing the dlock command prints, carries a
// URL's password or the value of a secret query parameter (password=,
// sslpassword=, token=, api_key=, …), whatever its length.
//
// # Concurrency and resources
//
// Client, Mutex, RWMutex, Semaphore, MultiMutex, Lease and MultiLease are
// safe for concurrent use. A Client runs one
// renewal goroutine that renews all of its leases in one driver call per
// tick. Close releases every lease and stops every goroutine the Client
// started.
package dlock
