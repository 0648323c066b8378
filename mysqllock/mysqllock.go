// Package mysqllock is the dlock driver for MySQL (8.0 or later) and
// MariaDB (10.6 or later), over go-sql-driver/mysql.
//
// It registers OpenURL for the URL scheme mysql:// (Scheme):
//
//	mysql://user:pass@host:3306/db?tls=true&mode=lease&table=dlock_locks
//
// mode and table are this driver's parameters (see Options); every other
// parameter is handed to go-sql-driver/mysql's DSN unchanged (tls, timeout,
// readTimeout, …). A *sql.DB opened from a URL belongs to the driver and is
// closed by Close; one passed to New stays the caller's. The mode is chosen
// once, in New or OpenURL: the driver then holds every lock the same way.
//
// # Modes
//
// ModeLease (the default) keeps one row per lock name in a table (created if
// missing): owner, hold count, fencing counter, lock_until and the lock-delay
// deadline, all decided by the server's UTC_TIMESTAMP(6). A grant is one
// INSERT … ON DUPLICATE KEY UPDATE whose assignments only change the row when
// it is free or already ours; the statement reports its outcome through
// LAST_INSERT_ID(expr), which the server returns in the statement's OK packet,
// so no second round trip and no reliance on affected-row counts (which
// differ with CLIENT_FOUND_ROWS). Rows are never deleted, so the fence
// counter only grows. Renewal of all leases is one UPDATE … WHERE (name,
// owner, fence) IN (…) per tick (plus one SELECT only when some lease was
// not renewed).
//
// ModeGetLock takes GET_LOCK(name, 0) on a connection pinned from the pool
// for as long as the lock is held. ModeRowLock holds SELECT … FOR UPDATE
// NOWAIT on the name's row in an open transaction on a pinned connection. In
// both the fencing token comes from an autocommitted increment of the name's
// row in the lock table made after the grant. In ModeGetLock the increment
// runs on the pinned session, gated on that session holding the lock (in
// the same query as the GET_LOCK statement when the connections accept
// several statements, as those of a driver opened from a URL do: one round
// trip per grant); in ModeRowLock it runs on a second connection, and the grant is returned only
// after the pinned session has taken the row again (FOR UPDATE NOWAIT, at
// once if it still holds it), so a session that died in between is never
// granted and no later holder can have a smaller token. The pinned session's
// wait_timeout is set to the TTL (rounded up to whole seconds), so a holder
// that stops renewing loses its session, and the lock, about one TTL later.
//
// MySQL has no notification. A holder keeps a companion GET_LOCK name, the
// lock's wake-up signal (SignalName), while it holds the lock, and waiters
// block in GET_LOCK on it, which the server grants the moment the holder
// gives it up or its session ends: a release wakes a waiter at once. In the
// session modes the holder's own statements take and give up the signal; in
// ModeLease one pooled connection per driver keeps the signals of leases
// held longer than 2ms, or at once of contended ones, and a release gives
// the signal up before it returns, so a waiter is woken before the releaser
// can loop back for the lock (see Driver.Subscribe). A holder that keeps no
// signal (a crashed process) is polled with backoff bounded by its
// remaining time (driver.LockedError.RetryAfter), as before.
//
// Lock kinds (driver.Kinder): ModeLease has read/write locks and
// semaphores, kept in <table>_kinds and <table>_holders (see kinds.go); the
// session modes have only mutexes (GET_LOCK has no shared form) and refuse
// the others with driver.ErrUnsupported. ModeLease takes several mutexes in
// one transaction (driver.MultiAcquirer), and every mode can raise a
// name's fencing counter (driver.FenceRaiser).
//
// Every grant's Key (driver.Grant.Key; "dlock run" hands it to CMD as
// DLOCK_KEY) names where the lock lives: "<table>/<name>" for a mutex,
// "<table>_holders/<name>/<kind>/<owner>" (kind read, write or permit) for
// the other kinds, after their rows in ModeLease; the session modes use
// the same form for the lock their session holds on the name.
//
// All methods of Driver are safe for concurrent use.
package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/standback"
)

// Mode selects how locks are held. See the package documentation.
type Mode string

// The modes. The URL parameter mode= takes the same strings.
const (
	ModeLease   Mode = "lease"
	ModeGetLock Mode = "getlock"
	ModeRowLock Mode = "rowlock"
)

// DefaultTable is the lock table used when Options.Table is empty.
const DefaultTable = sqlcommon.DefaultTable

// Options configures a Driver. A nil *Options means all defaults.
type Options struct {
	// Mode is how locks are held. Default ModeLease. URL: mode=.
	Mode Mode
	// Table is the lock table's name: [A-Za-z_][A-Za-z0-9_]*, at most 48
	// bytes, in the connection's database. It is created if missing
	// (ModeRowLock also creates Table+"_rowlock"). Default "dlock_locks".
	// URL: table=.
	Table string
}

// Driver is a dlock driver on a MySQL or MariaDB *sql.DB. It implements
// driver.Driver, driver.Notifier, driver.Inspector, driver.Kinder (every
// kind in ModeLease, the mutex only in the session modes),
// driver.Withdrawer, driver.MultiAcquirer (ModeLease),
// driver.FenceRaiser, and driver.Queuer with driver.QueueChooser (a
// ModeGetLock mutex waiter waits in the server, see Acquire). New chooses
// how it holds locks, once: a lease table or a session mode.
type Driver struct {
	*store
	base  *sqlcommon.Base
	ownDB bool
	mode  Mode
	sess  *sqlcommon.Sessions[pinned] // the session modes' held locks; nil in ModeLease
	// leaseSig keeps ModeLease's wake-up signals; nil in the session
	// modes, whose pinned sessions keep their own.
	leaseSig *leaseSignals
	lease    *leases            // ModeLease's Locker; nil in the session modes
	watches  *sqlcommon.Watches // waiters' waits for signals
	// stand is the stand-back after a contended release, and refusals
	// its sign of contention (see standback.go).
	stand    *standback.StandBack
	refusals *refusals
	// held tells Inspect which of the listed locks are held.
	held func(ctx context.Context, prefix string, out []driver.LockInfo) ([]bool, error)
}

// store is what every mode's SQL runs on.
type store struct {
	db    *sql.DB
	table string
	q     queries

	// testHookLocked, set only by tests before first use, runs inside a
	// session-mode TryAcquire before the fencing counter is incremented:
	// in ModeRowLock with the row locked, in ModeGetLock after the GET_LOCK
	// statement (which does not say whether it granted; with the hook set,
	// ModeGetLock sends that statement and the increment apart even when
	// multi is true).
	testHookLocked func(ctx context.Context, c *sql.Conn)
	// multi is whether db's connections accept several statements in one
	// query (go-sql-driver/mysql's multiStatements, which OpenURL turns on):
	// ModeGetLock then sends its GET_LOCK statement and the fence increment
	// in one round trip. Probed once, by createSchema.
	multi atomic.Bool
	// ids are the connection ids of the connections the session modes'
	// waits ran on (see getLock.Block, rowLock.Block).
	ids connIDs
	// losses are the session modes' per-connection loss signals; nil in
	// ModeLease.
	losses *connLosses
}

var _ interface {
	driver.Driver
	driver.Notifier
	driver.Inspector
	driver.Queuer
	driver.QueueChooser
} = (*Driver)(nil)

// New returns a driver using db. It does no I/O: the lock table is created on
// first use. Close does not close db.
func New(db *sql.DB, opts *Options) (*Driver, error) {
	if db == nil {
		return nil, errors.New("mysqllock: db is nil")
	}
	return newDriver(db, false, opts)
}

func newDriver(db *sql.DB, own bool, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	cfg, err := sqlcommon.Configure("mysqllock", string(o.Mode), o.Table, string(ModeLease), string(ModeGetLock), string(ModeRowLock))
	if err != nil {
		return nil, err
	}
	st := &store{db: db, table: cfg.Table, q: newQueries(cfg.Table)}
	d := &Driver{store: st, ownDB: own, mode: Mode(cfg.Mode)}
	var locker sqlcommon.Locker
	switch d.mode {
	case ModeLease:
		l := newLeases(st)
		locker, d.held, d.leaseSig = l, sqlcommon.Unexpired, l.sig
	case ModeGetLock:
		g := getLock{session{st}}
		d.sess, d.held = sqlcommon.NewSessions[pinned]("mysqllock", cfg.Mode, g), g.held
		locker = d.sess
	case ModeRowLock:
		r := rowLock{session{st}}
		d.sess, d.held = sqlcommon.NewSessions[pinned]("mysqllock", cfg.Mode, r), r.held
		locker = d.sess
	}
	d.stand = standback.New()
	if d.sess != nil {
		d.refusals = newRefusals()
		st.losses = newConnLosses()
	} else {
		d.refusals = d.leaseSig.refusals
	}
	d.base = sqlcommon.NewBase("mysqllock", locker, d.createSchema)
	d.watches = sqlcommon.NewWatches(st.openWaiter, st.watchLimit)
	if l, ok := locker.(*leases); ok {
		l.watches = d.watches
		d.lease = l
	}
	return d, nil
}

// Mode reports the driver's mode.
func (d *Driver) Mode() Mode { return d.mode }

// createSchema creates the lock table(s); sqlcommon.Base runs it once.
func (d *Driver) createSchema(ctx context.Context) error {
	// The first contact with the server: a failure to connect (refused,
	// TLS, credentials) is reported as such, not as the statement's.
	if err := d.db.PingContext(ctx); err != nil {
		return fmt.Errorf("mysqllock: cannot reach the server: %w", err)
	}
	stmts := []string{d.q.createTable}
	if d.mode == ModeRowLock {
		stmts = append(stmts, d.q.createRowTable)
	}
	for _, s := range stmts {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("mysqllock: creating lock table %s: %w", d.table, err)
		}
	}
	// A table made by an older version lacks fence_floor (see
	// RaiseFence); it is added in place, once (ALTER TABLE copies or locks
	// the table, so only when missing; a concurrent addition's duplicate
	// column error, 1060, means it is there).
	var n int
	if err := d.db.QueryRowContext(ctx, d.q.hasFloor).Scan(&n); err != nil {
		return fmt.Errorf("mysqllock: reading lock table %s: %w", d.table, err)
	}
	if n == 0 {
		if _, err := d.db.ExecContext(ctx, d.q.addFloor); err != nil && errNumber(err) != 1060 {
			return fmt.Errorf("mysqllock: adding column fence_floor to lock table %s: %w", d.table, err)
		}
	}
	for _, s := range []string{d.q.createKinds, d.q.createHolders} {
		if _, err := d.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("mysqllock: creating lock table %s: %w", d.table, err)
		}
	}
	// Without multiStatements the server gets "DO 1; DO 1" as one
	// statement and refuses it as a syntax error.
	_, err := d.db.ExecContext(ctx, "DO 1; DO 1")
	d.multi.Store(err == nil)
	return nil
}

// TryAcquire implements driver.Driver.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if !d.SupportsKind(req.Kind) {
		return driver.Grant{}, d.unsupported(req.Kind)
	}
	if err := d.stand.Wait(ctx, req, nil); err != nil {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: %w", err)
	}
	// What the driver keeps of a held lock's name (the lease signals' map
	// in ModeLease, the hold in the session modes) shares the key's bytes.
	key, req := sqlcommon.KeyedRequest(d.table, req)
	g, err := d.base.TryAcquire(ctx, req)
	if err == nil {
		g.Key = key
		if g.Count == 1 && d.stand.Granted(req, g.Token) {
			d.refusals.forget(req.Name)
		}
	} else if errors.Is(err, driver.ErrLocked) {
		d.refusals.add(req.Name)
		d.stand.Refused(req)
	}
	return g, err
}

// Queues implements driver.QueueChooser: in ModeGetLock a waiting Lock of
// a mutex waits in the server (GET_LOCK with a timeout, see Acquire) while
// fewer than half of the pool's connections are in use and the driver
// does not hold the name for the same owner; in ModeRowLock too (a locking
// read that waits), when a third of the TTL is a second or more
// (innodb_lock_wait_timeout counts whole seconds, and a turn must leave a
// grant two thirds of the TTL). Every other waiting Lock is a loop of
// tries woken by the holder's signal (see SignalName).
func (d *Driver) Queues(req driver.AcquireRequest) bool {
	switch {
	case d.mode == ModeGetLock:
	case d.mode == ModeRowLock && req.TTL/3 >= time.Second:
	default:
		return false
	}
	st := d.db.Stats()
	limit := st.MaxOpenConnections
	if limit <= 0 {
		limit = math.MaxInt32 // no limit
	}
	return d.sess.Blocks(req, st.InUse, limit)
}

// Acquire implements driver.Queuer for the requests Queues accepts: the
// lock is waited for on a pinned connection blocked in GET_LOCK, so the
// server grants it to its waiters in the order they came, each taking it
// the moment its holder lets go. The token is the fence bump after the
// grant, as in TryAcquire. Each turn waits at most a third of the TTL, so
// that a lease counted from the turn's send time keeps two thirds of it.
// When ctx ends, the wait is ended by KILL QUERY and nothing is left held.
// A grant made this way takes the name off the driver's contended list:
// waiters waiting in the server need no stand-back (see standback.go).
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.mode == ModeLease || req.Kind != driver.Exclusive || (d.mode == ModeRowLock && req.TTL/3 < time.Second) {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: mode %s waits by its signal, not in the server, for this request: %w", d.mode, driver.ErrUnsupported)
	}
	if err := d.base.Ready(ctx); err != nil {
		return driver.Grant{}, err
	}
	key, req := sqlcommon.KeyedRequest(d.table, req)
	g, err := d.sess.Acquire(ctx, req)
	if err == nil {
		g.Key = key
		if g.Count == 1 {
			d.stand.Granted(req, g.Token)
			d.refusals.forget(req.Name)
		}
	}
	return g, err
}

// Release implements driver.Driver. The last release of a contended mutex
// makes this driver stand back from it for a moment (see standback.go).
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	n, err := d.base.Release(ctx, l)
	if err == nil && n == 0 && l.Kind == driver.Exclusive && l.Token != 0 {
		if d.watches.Watching(l.Name) || d.refusals.recent(l.Name) {
			d.stand.Released(l.Name, l.Token)
		}
	}
	return n, err
}

// Renew implements driver.Driver. In ModeLease it is one UPDATE per 2,000
// leases sharing a TTL (one statement per tick in the common case); in the
// session modes it pings each pinned connection (in parallel) and reports
// ErrSessionLost for those that are gone.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	return d.base.Renew(ctx, ls)
}

// Close closes the connections pinned by held locks (which frees session
// locks on the server) and, if the driver opened the *sql.DB itself from a
// URL, closes it. Leases in ModeLease are left to expire. Close is
// idempotent.
func (d *Driver) Close() error {
	if !d.base.Close() {
		return nil
	}
	d.watches.Close(true)
	if !d.ownDB {
		return nil
	}
	return d.db.Close()
}

// kill simulates a crash for the test harness: pinned connections are
// abandoned as they are (no release, no more traffic, so the server frees
// their locks when wait_timeout ends the sessions) and later calls fail.
// Close closes the abandoned connections.
func (d *Driver) kill() {
	d.base.Kill()
	d.watches.Close(true)
	if d.ownDB {
		_ = d.db.Close()
	}
}
