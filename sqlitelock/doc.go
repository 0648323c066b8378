// Package sqlitelock is the dlock driver for an SQLite database file: the
// embedded default, with nothing to install or run.
//
// Each lock is one row of a table (default "dlock_locks"):
//
//	name TEXT PRIMARY KEY, owner TEXT, count INTEGER, fence INTEGER,
//	updated_at, lock_until, delay_until INTEGER  -- ms since the Unix epoch
//
// A grant is a single INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING
// statement: it inserts the row (fence 1), or takes it over when it is free
// (released, or past its expiry plus lock-delay) with fence+1, or re-enters
// it when the same owner still holds it (count+1, same fence, TTL reset). A
// release is an UPDATE that checks name, owner, fence and expiry (a second
// one only when the owner had re-entered); a renewal is one UPDATE … FROM
// (VALUES …) per 256 leases, all in one transaction. Each write statement
// takes SQLite's write lock before it reads the row, so concurrent writers in
// several processes serialise on the file's lock. Rows are never deleted, so
// the fence column never goes back.
//
// Read/write locks and semaphores (driver.Kinder) live in two more tables,
// <table>_kinds (a counter and a permit count per name and kind) and
// <table>_holders (a row per reader, writer, permit or waiting writer's
// mark, each with its own token, lease and lock-delay); a grant is one
// transaction whose first statement locks the _kinds row, and a release
// deletes the holder's row. Several mutexes are taken in one transaction
// (driver.MultiAcquirer), and a name's counter can be raised
// (driver.FenceRaiser; a held mutex keeps its token and the raise waits in
// its row's fence_floor column). Tables made by older versions are brought
// up to date in place when opened.
//
// # Guarantees
//
//   - Mutual exclusion among live holders on one machine: every process that
//     uses the lock must open the same file on a local filesystem. SQLite's
//     locking is not reliable on network filesystems (NFS, SMB); do not put
//     the file there.
//   - Time is SQLite's clock, read inside the statement that decides (the
//     host's wall clock, shared by every process on the machine). Go's clock
//     is never compared with it. A step of the host's wall clock moves every
//     expiry with it.
//   - Fencing tokens are strictly increasing per name for the life of the
//     file, including across holders that crashed: the fence column is
//     incremented in the same statement that grants, and Open sets
//     synchronous=FULL so a grant that returned survives a power loss.
//   - A holder that dies without releasing loses the lock when its lease
//     expires by SQLite's clock, plus its lock-delay. A release frees the
//     lock at once, with no delay.
//   - Release and renewal are owner-only: they match the row's owner and
//     fence, and a stale holder can never touch a newer grant. Both also
//     require the lease to be unexpired by SQLite's clock: a release or
//     renewal that arrives after expiry returns ErrNotHeld even if nobody
//     has taken the lock yet. The lease ended at its expiry, not at the
//     late release, so its lock-delay runs in full, and a renewal never
//     revives it.
//
// SQLite has no notification, but every user of a database is on one
// machine, so a release is signalled through companion files next to the
// database, in the directory <database>-dlock.d (64 files, named 0 to 63,
// created with the database file's permission bits): a holder keeps an
// exclusive lock on one byte of one of them (Linux open-file-description
// locks; the file and the offset are hashed from the lock's name) until it
// releases, and a waiter blocks for a shared lock on that byte,
// which the kernel grants the moment the holder lets go or its process
// ends (Driver.Subscribe, driver.Notifier). The grant itself is still the
// table's one statement: a wake-up only says "try now". A holder that keeps
// no byte lock (a crashed process, or a version before the directory, which
// kept its byte locks on the one file <database>-dlock) is polled on a
// backoff and at the holder's remaining time, which TryAcquire reports in
// driver.LockedError.RetryAfter. Without the companion files (they cannot
// be created, or not on Linux) waiters poll as well.
//
// Every grant's Key (driver.Grant.Key; "dlock run" hands it to CMD as
// DLOCK_KEY) names its row: "<table>/<name>" for a mutex,
// "<table>_holders/<name>/<kind>/<owner>" (kind read, write or permit) for
// a read/write lock or a semaphore.
//
// # URLs
//
// The package registers the scheme "sqlite" with dlock:
//
//	sqlite:///var/lib/app/locks.db        absolute path /var/lib/app/locks.db
//	sqlite://locks/app.db                 relative path locks/app.db (from the working directory)
//	sqlite:locks/app.db                   the same
//	sqlite:///tmp/x.db?table=my_locks&busy_timeout=10s
//
// An empty host means the path is absolute; a non-empty host is the first
// element of a relative path. Query parameters map one-to-one onto Options
// (table, busy_timeout); any other parameter is refused.
package sqlitelock
