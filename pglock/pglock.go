// Package pglock is the dlock driver for PostgreSQL, over pgx v5.
//
// It registers OpenURL for the URL schemes postgres:// (Scheme) and
// postgresql:// (SchemeAlt):
//
//	postgres://user:pass@host:5432/db?sslmode=require&mode=lease&table=dlock_locks
//
// mode and table are this driver's parameters (see Options); every other
// parameter goes to pgx unchanged (sslmode, pool_max_conns, connect_timeout,
// application_name, …). A pool opened from a URL belongs to the driver and is
// closed by Close; a pool passed to New stays the caller's. The mode is
// chosen once, in New or OpenURL: the driver then holds every lock the same
// way.
//
// # Modes
//
// ModeLease (the default) keeps one row per lock name in a table (created if
// missing): owner, hold count, fencing counter, lock_until and the lock-delay
// deadline, all decided by the server's now(). A grant is one
// INSERT … ON CONFLICT … DO UPDATE … WHERE <free or ours> RETURNING; the row is
// never deleted, so its fence counter only grows. Renewal of all of a driver's
// leases is one UPDATE … FROM unnest(…) per tick. The tables are created
// WITH (fillfactor = 50), which keeps these rewrites HOT. A release commits
// with synchronous_commit = off (its own transaction only; grants stay
// synchronous): one lost in a crash or failover leaves the lease to expire,
// as a crashed holder's would. A release NOTIFYs waiters
// when there are any: a driver's LISTEN session marks the names it has
// subscribers for with a shared advisory lock on WaitKey(name), and a
// release, in every mode, NOTIFYs only when it cannot take that key
// exclusively.
//
// ModeAdvisory takes pg_try_advisory_lock on a 64-bit hash of the name on a
// connection pinned from the pool for as long as the lock is held; the lock
// ends when that connection does. ModeRowLock holds SELECT … FOR UPDATE
// NOWAIT on the name's row in an open transaction on a pinned connection. In
// both, the fencing token is made durable after the grant, so a crash never
// lets a token be reused. In ModeAdvisory it is drawn, in the statement that
// takes the lock, from two sequences per table: nextval of <table>_tokens plus
// the current value of <table>_token_floor (which RaiseFence raises), with
// txid_current() so that the commit flushes the WAL covering the draw before
// the grant is reported; no row is written (one counter for all names, still
// strictly increasing per name). In ModeRowLock it is an autocommitted
// increment of the name's row in the lock table, on a second connection,
// and the grant is returned only after the pinned session has confirmed,
// after the increment, that its transaction still holds the row, so a session
// that died in between is never granted and no later holder can have a
// smaller token. The pinned session gets a server-side idle timeout of one TTL
// (idle_session_timeout, PostgreSQL 14 and later; in ModeRowLock
// idle_in_transaction_session_timeout), re-armed by every renewal, so a holder
// that stops renewing loses its lock about one TTL later even while its TCP
// connection stays open. Each held lock takes one pool connection (ModeRowLock
// a second one for an instant at the grant): size the pool for the locks held
// at once.
//
// Lock kinds (driver.Kinder): ModeLease has read/write locks and
// semaphores, kept in <table>_kinds and <table>_holders (see kinds.go);
// ModeAdvisory has read/write locks on shared advisory locks (see
// advisory_kinds.go), ModeRowLock on shared row locks (FOR SHARE, see
// rowlock_kinds.go); neither session mode has semaphores. Kinds a mode
// lacks are refused with driver.ErrUnsupported. ModeLease takes several mutexes in
// one round trip (driver.MultiAcquirer), and every mode can raise a
// name's fencing counter (driver.FenceRaiser).
//
// Every grant's Key (driver.Grant.Key; "dlock run" hands it to CMD as
// DLOCK_KEY) names where the lock lives: "<table>/<name>" for a mutex,
// "<table>_holders/<name>/<kind>/<owner>" (kind read, write or permit) for
// the other kinds, after their rows in ModeLease; the session modes use
// the same form for the lock their session holds on the name.
//
// PostgreSQL 12 or later. The lock table must live on the primary; see
// docs/backends.md for what a failover does to each mode.
//
// All methods of Driver are safe for concurrent use.
package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/standback"
)

// Mode selects how locks are held. See the package documentation.
type Mode string

// The modes. The URL parameter mode= takes the same strings.
const (
	ModeLease    Mode = "lease"
	ModeAdvisory Mode = "advisory"
	ModeRowLock  Mode = "rowlock"
)

// DefaultTable is the lock table used when Options.Table is empty.
const DefaultTable = sqlcommon.DefaultTable

// Options configures a Driver. A nil *Options means all defaults.
type Options struct {
	// Mode is how locks are held. Default ModeLease. URL: mode=.
	Mode Mode
	// Table is the lock table's name: [A-Za-z_][A-Za-z0-9_]*, at most 48
	// bytes, in the connection's search_path. It is created if missing
	// (ModeRowLock also creates Table+"_rowlock", ModeAdvisory the
	// sequences Table+"_tokens" and Table+"_token_floor"). Default
	// "dlock_locks".
	// URL: table=.
	Table string
}

// Driver is a dlock driver on a PostgreSQL pool. It implements
// driver.Driver, driver.Notifier, driver.Inspector, driver.Kinder (the
// kinds its mode has), driver.Withdrawer, driver.MultiAcquirer (ModeLease),
// driver.FenceRaiser, and driver.Queuer with driver.QueueChooser (a
// session-mode mutex waiter waits in the server, see Acquire). New chooses
// how it holds locks, once: a lease table or a session mode.
type Driver struct {
	*store
	base    *sqlcommon.Base
	ownPool bool
	mode    Mode
	sess    *sqlcommon.Sessions[*pinned] // the session modes' held locks; nil in ModeLease
	// held tells Inspect which of the listed locks are held.
	held func(ctx context.Context, prefix string, out []driver.LockInfo) ([]bool, error)
	ln   *listener
	// stand holds ModeLease's new attempts back after a release that
	// woke waiters (see standback.StandBack); nil in the session modes,
	// whose waiters wait in the server.
	stand *standback.StandBack
}

// store is what every mode's SQL runs on.
type store struct {
	pool    *pgxpool.Pool
	table   string
	channel string
	q       queries
	pgVer   int        // server_version_num, read with the schema
	rows    *knownRows // ModeAdvisory: names whose row is known to exist
	grown   *growth    // rows added, and the ANALYZEs that follow them

	// testHookLocked, set only by tests before first use, runs inside a
	// session-mode TryAcquire with the lock just taken on the server: in
	// ModeRowLock before the fencing counter is incremented, in
	// ModeAdvisory after the one statement that does both.
	testHookLocked func(ctx context.Context, c *pinned)
	// testHookBlockErr, set only by tests before first use, may replace
	// the outcome of a ModeAdvisory waiting turn's statement (nil when it
	// was granted), as the server's timeout racing a grant can.
	testHookBlockErr func(err error) error
}

var _ interface {
	driver.Driver
	driver.Notifier
	driver.Inspector
	driver.Queuer
	driver.QueueChooser
} = (*Driver)(nil)

// New returns a driver using pool. It does no I/O: the lock table is created
// on first use. Close does not close pool.
func New(pool *pgxpool.Pool, opts *Options) (*Driver, error) {
	if pool == nil {
		return nil, errors.New("pglock: pool is nil")
	}
	return newDriver(pool, false, opts)
}

func newDriver(pool *pgxpool.Pool, own bool, opts *Options) (*Driver, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	cfg, err := sqlcommon.Configure("pglock", string(o.Mode), o.Table, string(ModeLease), string(ModeAdvisory), string(ModeRowLock))
	if err != nil {
		return nil, err
	}
	st := &store{pool: pool, table: cfg.Table, channel: strings.ToLower(cfg.Table) + "_release", q: newQueries(cfg.Table), rows: &knownRows{}, grown: newGrowth(cfg.Table)}
	d := &Driver{store: st, ownPool: own, mode: Mode(cfg.Mode)}
	var locker sqlcommon.Locker
	switch d.mode {
	case ModeLease:
		d.stand = standback.New()
		l := leases{store: st, stand: d.stand}
		locker, d.held = l, sqlcommon.Unexpired
	case ModeAdvisory:
		a := advisory{session{st}}
		d.sess = sqlcommon.NewSessions[*pinned]("pglock", cfg.Mode, a)
		d.held = func(ctx context.Context, _ string, out []driver.LockInfo) ([]bool, error) {
			return a.held(ctx, d.sess, out)
		}
		locker = d.sess
	case ModeRowLock:
		r := rowLock{session{st}}
		d.sess, d.held = sqlcommon.NewSessions[*pinned]("pglock", cfg.Mode, r), r.held
		locker = d.sess
	}
	d.base = sqlcommon.NewBase("pglock", locker, d.createSchema)
	d.ln = newListener(d)
	return d, nil
}

// Queues implements driver.QueueChooser: in the session modes a waiting
// Lock of a mutex without lock-delay waits in the server (see Acquire)
// while fewer than half of the pool's connections are in use and the
// driver holds nothing under the name; every other waiting Lock (and every
// one in ModeLease) is a loop of tries woken by release notifications.
func (d *Driver) Queues(req driver.AcquireRequest) bool {
	if d.sess == nil {
		return false
	}
	st := d.pool.Stat()
	return d.sess.Blocks(req, int(st.AcquiredConns()), int(st.MaxConns()))
}

// Acquire implements driver.Queuer for the requests Queues accepts: the
// lock is waited for on a pinned connection blocked in pg_advisory_lock
// (ModeAdvisory; the token is drawn in the same statement, after the
// grant) or in a locking read of the name's row without NOWAIT
// (ModeRowLock; the fence is incremented after the grant, as for a try), so
// the server grants it to its waiters in the order they came, each taking
// it the moment its holder lets go. Each turn waits at most a third of the
// TTL (lock_timeout), so that a lease counted from the turn's send time
// keeps two thirds of it. When ctx ends, the server is asked to cancel the
// wait (a cancel request, see sqlcommon.CancelOnDone) and nothing is left
// held.
func (d *Driver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.sess == nil || !d.SupportsKind(req.Kind) {
		return driver.Grant{}, fmt.Errorf("pglock: acquire: mode %s waits by notification, not in the server: %w", d.mode, driver.ErrUnsupported)
	}
	if err := d.base.Ready(ctx); err != nil {
		return driver.Grant{}, err
	}
	g, err := d.sess.Acquire(ctx, req)
	if err == nil {
		g.Key = sqlcommon.GrantKey(d.table, req)
	}
	return g, err
}

// Mode reports the driver's mode.
func (d *Driver) Mode() Mode { return d.mode }

// createSchema creates the lock table(s); sqlcommon.Base runs it once.
func (d *Driver) createSchema(ctx context.Context) error {
	// The first contact with the server: a failure to connect (refused,
	// TLS, credentials) is reported as such, not as the statement's.
	if err := d.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pglock: cannot reach the server: %w", err)
	}
	var ver int
	if err := d.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&ver); err != nil {
		return fmt.Errorf("pglock: reading server version: %w", err)
	}
	if ver < 120000 {
		return fmt.Errorf("pglock: PostgreSQL %d.%d is too old (12 or later is needed)", ver/10000, ver%10000)
	}
	stmts := []string{d.q.createTable}
	if d.mode == ModeRowLock {
		stmts = append(stmts, d.q.createRowTable)
	}
	stmts = append(stmts, d.q.createKinds, d.q.createHolders)
	for i, s := range stmts {
		if i == 1 {
			// A table made by an older version lacks fence_floor (see
			// RaiseFence). ALTER TABLE takes the table's strongest lock,
			// even when the column exists, so it runs only when missing.
			var has bool
			if err := d.pool.QueryRow(ctx, d.q.hasFloor, d.table).Scan(&has); err != nil {
				return fmt.Errorf("pglock: reading lock table %s: %w", d.table, err)
			}
			if !has {
				if _, err := d.pool.Exec(ctx, d.q.addFloor); err != nil {
					return fmt.Errorf("pglock: adding column fence_floor to lock table %s: %w", d.table, err)
				}
			}
		}
		if _, err := d.pool.Exec(ctx, s); err != nil {
			// Two processes creating the table at once can race in the
			// catalog; the loser sees a unique violation and the table exists.
			if !isUniqueViolation(err) {
				return fmt.Errorf("pglock: creating lock table %s: %w", d.table, err)
			}
		}
	}
	if d.mode == ModeAdvisory {
		if err := d.createTokens(ctx); err != nil {
			return err
		}
	}
	d.pgVer = ver
	return nil
}

// tokenRaiseKey is the transaction-scoped advisory lock that serialises the
// raises of table's token floor (RaiseFence, and the migration in
// createTokens).
func tokenRaiseKey(table string) int64 { return AdvisoryKey("\x00raise\x00" + table) }

// createTokens creates ModeAdvisory's two sequences: <table>_tokens, whose
// next value plus <table>_token_floor's current one is each grant's token.
// A table that existed before them had its tokens counted per row (its
// fence column): its floor is raised above all of those before the token
// sequence is created, so a driver that finds the token sequence finds
// the floor raised.
func (d *Driver) createTokens(ctx context.Context) error {
	var has bool
	if err := d.pool.QueryRow(ctx, d.q.hasTokens).Scan(&has); err != nil {
		return fmt.Errorf("pglock: reading token sequence of %s: %w", d.table, err)
	}
	if has {
		return nil
	}
	if _, err := d.pool.Exec(ctx, d.q.createTokenFloor); err != nil && !isUniqueViolation(err) {
		return fmt.Errorf("pglock: creating token floor sequence of %s: %w", d.table, err)
	}
	if _, err := d.pool.Exec(ctx, d.q.migrateTokens, tokenRaiseKey(d.table)); err != nil {
		return fmt.Errorf("pglock: raising token floor of %s above its rows' fences: %w", d.table, err)
	}
	if _, err := d.pool.Exec(ctx, d.q.createTokens); err != nil && !isUniqueViolation(err) {
		return fmt.Errorf("pglock: creating token sequence of %s: %w", d.table, err)
	}
	return nil
}

// TryAcquire implements driver.Driver.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if !d.SupportsKind(req.Kind) {
		return driver.Grant{}, d.unsupported(req.Kind)
	}
	if d.stand != nil {
		if err := d.stand.Wait(ctx, req, nil); err != nil {
			return driver.Grant{}, fmt.Errorf("pglock: acquire: %w", err)
		}
	}
	g, err := d.base.TryAcquire(ctx, req)
	if err == nil {
		g.Key = sqlcommon.GrantKey(d.table, req)
	}
	if d.stand != nil {
		if err == nil && g.Count == 1 {
			d.stand.Granted(req, g.Token)
		} else if errors.Is(err, driver.ErrLocked) {
			d.stand.Refused(req)
		}
	}
	return g, err
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	return d.base.Release(ctx, l)
}

// Renew implements driver.Driver. In ModeLease it is one UPDATE for all of
// ls; in the session modes it pings each pinned connection (in parallel) and
// reports ErrSessionLost for those that are gone.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	return d.base.Renew(ctx, ls)
}

// Close stops the listener, closes the connections pinned by held locks
// (which frees session locks on the server) and, if the driver opened the
// pool itself from a URL, closes the pool. Leases in ModeLease are left to
// expire. Close is idempotent.
func (d *Driver) Close() error {
	if !d.base.Close() {
		return nil
	}
	d.ln.close()
	d.grown.close()
	if d.ownPool {
		d.pool.Close()
	}
	return nil
}

// kill simulates a crash for the test harness: the pinned connections are
// abandoned as they are (no unlock, no more traffic, so the server frees
// their locks only when its idle timeout ends the sessions), background
// work stops, and later calls fail. Close closes the abandoned sockets.
func (d *Driver) kill() {
	d.base.Kill()
	d.ln.close()
	d.grown.close()
	if d.ownPool {
		d.pool.Close()
	}
}

func micros(d time.Duration) int64 { return sqlcommon.Micros(d) }

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }
