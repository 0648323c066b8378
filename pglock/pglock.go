// Package pglock is the dlock driver for PostgreSQL, over pgx v5.
//
// It registers the URL schemes postgres:// and postgresql://:
//
//	postgres://user:pass@host:5432/db?sslmode=require&mode=lease&table=dlock_locks
//
// mode and table are this driver's parameters (see Options); every other
// parameter goes to pgx unchanged (sslmode, pool_max_conns, connect_timeout,
// application_name, …). A pool opened from a URL belongs to the driver and is
// closed by Close; a pool passed to New stays the caller's.
//
// # Modes
//
// ModeLease (the default) keeps one row per lock name in a table (created if
// missing): owner, hold count, fencing counter, lock_until and the lock-delay
// deadline, all decided by the server's now(). A grant is one
// INSERT … ON CONFLICT … DO UPDATE … WHERE <free or ours> RETURNING; the row is
// never deleted, so its fence counter only grows. Renewal of all of a driver's
// leases is one UPDATE … FROM unnest(…) per tick. A release NOTIFYs waiters.
//
// ModeAdvisory takes pg_try_advisory_lock on a 64-bit hash of the name on a
// connection pinned from the pool for as long as the lock is held; the lock
// ends when that connection does. ModeRowLock holds SELECT … FOR UPDATE
// NOWAIT on the name's row in an open transaction on a pinned connection. In
// both, the fencing token comes from an autocommitted increment of the name's
// row in the lock table made after the grant, so a crash never lets a token be
// reused. The pinned session gets a server-side idle timeout of one TTL
// (idle_session_timeout, PostgreSQL 14 and later; in ModeRowLock
// idle_in_transaction_session_timeout), re-armed by every renewal, so a holder
// that stops renewing loses its lock about one TTL later even while its TCP
// connection stays open. Each held lock takes one pool connection (ModeRowLock
// a second one for an instant at the grant): size the pool for the locks held
// at once.
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
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
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
	// (ModeRowLock also creates Table+"_rowlock"). Default "dlock_locks".
	// URL: table=.
	Table string
}

// Driver is a dlock driver on a PostgreSQL pool. It implements
// driver.Driver, driver.Notifier and driver.Inspector.
type Driver struct {
	pool    *pgxpool.Pool
	ownPool bool
	mode    Mode
	table   string
	channel string
	q       queries

	schemaMu sync.Mutex
	schemaOK bool
	pgVer    int

	sess *sqlcommon.Sessions[*pinned] // session modes: held locks; closed state

	ln *listener
}

var _ interface {
	driver.Driver
	driver.Notifier
	driver.Inspector
} = (*Driver)(nil)

func init() {
	dlock.Register("postgres", open)
	dlock.Register("postgresql", open)
}

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
	if o.Mode == "" {
		o.Mode = ModeLease
	}
	switch o.Mode {
	case ModeLease, ModeAdvisory, ModeRowLock:
	default:
		return nil, fmt.Errorf("pglock: unknown mode %q (want lease, advisory or rowlock)", o.Mode)
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := sqlcommon.CheckTable(o.Table); err != nil {
		return nil, fmt.Errorf("pglock: %w", err)
	}
	d := &Driver{
		pool:    pool,
		ownPool: own,
		mode:    o.Mode,
		table:   o.Table,
		channel: strings.ToLower(o.Table) + "_release",
		sess:    sqlcommon.NewSessions[*pinned]("pglock"),
	}
	d.q = newQueries(o.Table)
	d.ln = newListener(d)
	return d, nil
}

// open is the URLOpener for postgres:// and postgresql://.
func open(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opts, rest, err := parseURL(u)
	if err != nil {
		return nil, dlock.BadURL("%v", sqlcommon.Redact(err, u))
	}
	cfg, err := pgxpool.ParseConfig(rest.String())
	if err != nil {
		return nil, dlock.BadURL("%v", sqlcommon.Redact(fmt.Errorf("pglock: %w", err), u))
	}
	if !rest.Query().Has("pool_max_conns") {
		// Session modes pin one connection per held lock.
		cfg.MaxConns = 32
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, sqlcommon.Redact(fmt.Errorf("pglock: %w", err), u)
	}
	d, err := newDriver(pool, true, opts)
	if err != nil {
		pool.Close()
		return nil, dlock.BadURL("%v", err) // options from the URL
	}
	if err := d.ensureSchema(ctx); err != nil {
		pool.Close()
		return nil, sqlcommon.Redact(err, u)
	}
	return d, nil
}

// parseURL takes this driver's parameters out of u and returns the options
// and the URL to hand to pgx.
func parseURL(u *url.URL) (*Options, *url.URL, error) {
	rest := *u
	q := rest.Query()
	o := &Options{Mode: Mode(q.Get("mode")), Table: q.Get("table")}
	if q.Has("mode") && o.Mode == "" {
		return nil, nil, errors.New("pglock: URL parameter mode is empty")
	}
	if q.Has("table") && o.Table == "" {
		return nil, nil, errors.New("pglock: URL parameter table is empty")
	}
	q.Del("mode")
	q.Del("table")
	rest.RawQuery = q.Encode()
	return o, &rest, nil
}

// Mode reports the driver's mode.
func (d *Driver) Mode() Mode { return d.mode }

func (d *Driver) check() error { return d.sess.Check() }

// ensureSchema creates the lock table(s) once.
func (d *Driver) ensureSchema(ctx context.Context) error {
	d.schemaMu.Lock()
	defer d.schemaMu.Unlock()
	if d.schemaOK {
		return nil
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
	for _, s := range stmts {
		if _, err := d.pool.Exec(ctx, s); err != nil {
			// Two processes creating the table at once can race in the
			// catalog; the loser sees a unique violation and the table exists.
			if !isUniqueViolation(err) {
				return fmt.Errorf("pglock: creating lock table %s: %w", d.table, err)
			}
		}
	}
	d.pgVer = ver
	d.schemaOK = true
	return nil
}

func (d *Driver) ready(ctx context.Context) error {
	if err := d.check(); err != nil {
		return err
	}
	return d.ensureSchema(ctx)
}

// TryAcquire implements driver.Driver.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := d.ready(ctx); err != nil {
		return driver.Grant{}, err
	}
	if d.mode == ModeLease {
		return d.leaseAcquire(ctx, req)
	}
	return d.sessionAcquire(ctx, req)
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if err := d.ready(ctx); err != nil {
		return 0, err
	}
	if d.mode == ModeLease {
		return d.leaseRelease(ctx, l)
	}
	return d.sessionRelease(ctx, l)
}

// Renew implements driver.Driver. In ModeLease it is one UPDATE for all of
// ls; in the session modes it pings each pinned connection (in parallel) and
// reports ErrSessionLost for those that are gone.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if err := d.ready(ctx); err != nil {
		return nil, err
	}
	if len(ls) == 0 {
		return nil, nil
	}
	if d.mode == ModeLease {
		return d.leaseRenew(ctx, ls)
	}
	return d.sessionRenew(ctx, ls)
}

// Close stops the listener, closes the connections pinned by held locks
// (which frees session locks on the server) and, if the driver opened the
// pool itself from a URL, closes the pool. Leases in ModeLease are left to
// expire. Close is idempotent.
func (d *Driver) Close() error {
	holds, first := d.sess.Close()
	if !first {
		return nil
	}
	d.ln.close()
	d.sess.EndAll(holds)
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
	d.sess.Kill()
	d.ln.close()
	if d.ownPool {
		d.pool.Close()
	}
}

func micros(d time.Duration) int64 { return sqlcommon.Micros(d) }

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }
