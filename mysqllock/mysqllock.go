// Package mysqllock is the dlock driver for MySQL (8.0 or later) and
// MariaDB (10.6 or later), over go-sql-driver/mysql.
//
// It registers the URL scheme mysql://:
//
//	mysql://user:pass@host:3306/db?tls=true&mode=lease&table=dlock_locks
//
// mode and table are this driver's parameters (see Options); every other
// parameter is handed to go-sql-driver/mysql's DSN unchanged (tls, timeout,
// readTimeout, …). A *sql.DB opened from a URL belongs to the driver and is
// closed by Close; one passed to New stays the caller's.
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
// row in the lock table made after the grant, and the pinned session's
// wait_timeout is set to the TTL (rounded up to whole seconds), so a holder
// that stops renewing loses its session, and the lock, about one TTL later.
//
// MySQL has no notification, so waiters poll with backoff bounded by the
// holder's remaining time (reported in driver.LockedError.RetryAfter).
//
// All methods of Driver are safe for concurrent use.
package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
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
// driver.Driver and driver.Inspector.
type Driver struct {
	db    *sql.DB
	ownDB bool
	mode  Mode
	table string
	q     queries

	acquireStmt, releaseStmt *prepared

	schemaMu sync.Mutex
	schemaOK bool

	sess *sqlcommon.Sessions[pinned] // session modes: held locks; closed state
}

var _ interface {
	driver.Driver
	driver.Inspector
} = (*Driver)(nil)

func init() { dlock.Register("mysql", open) }

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
	if o.Mode == "" {
		o.Mode = ModeLease
	}
	switch o.Mode {
	case ModeLease, ModeGetLock, ModeRowLock:
	default:
		return nil, fmt.Errorf("mysqllock: unknown mode %q (want lease, getlock or rowlock)", o.Mode)
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := sqlcommon.CheckTable(o.Table); err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	q := newQueries(o.Table)
	return &Driver{db: db, ownDB: own, mode: o.Mode, table: o.Table, q: q, sess: sqlcommon.NewSessions[pinned]("mysqllock"),
		acquireStmt: newPrepared(q.leaseAcquire), releaseStmt: newPrepared(q.leaseRelease)}, nil
}

// maxURLConns is the connection limit of a *sql.DB opened from a URL.
const maxURLConns = 32

func open(ctx context.Context, u *url.URL) (driver.Driver, error) {
	opts, dsn, err := ParseURL(u)
	if err != nil {
		return nil, dlock.BadURL("%v", sqlcommon.Redact(err, u))
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, dlock.BadURL("%v", sqlcommon.Redact(fmt.Errorf("mysqllock: %w", err), u))
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, sqlcommon.Redact(fmt.Errorf("mysqllock: %w", err), u)
	}
	db := sql.OpenDB(conn)
	// Bound the burst of many waiters polling at once; session modes pin one
	// connection per held lock, so this also bounds the locks a URL-opened
	// driver can hold at once. Pass your own *sql.DB to New for other limits.
	db.SetMaxOpenConns(maxURLConns)
	db.SetMaxIdleConns(8)
	d, err := newDriver(db, true, opts)
	if err != nil {
		_ = db.Close()
		return nil, dlock.BadURL("%v", err) // options from the URL
	}
	if err := d.ensureSchema(ctx); err != nil {
		_ = db.Close()
		return nil, sqlcommon.Redact(err, u)
	}
	return d, nil
}

// ParseURL converts a mysql:// URL into Options and a go-sql-driver/mysql
// DSN ("user:pass@tcp(host:port)/db?params"). The port defaults to 3306.
// mode and table are taken out; every other query parameter is passed on.
func ParseURL(u *url.URL) (*Options, string, error) {
	if u.Scheme != "mysql" {
		return nil, "", fmt.Errorf("mysqllock: URL scheme %q, want mysql", u.Scheme)
	}
	if u.Host == "" {
		return nil, "", errors.New("mysqllock: URL has no host")
	}
	q := u.Query()
	o := &Options{Mode: Mode(q.Get("mode")), Table: q.Get("table")}
	if q.Has("mode") && o.Mode == "" {
		return nil, "", errors.New("mysqllock: URL parameter mode is empty")
	}
	if q.Has("table") && o.Table == "" {
		return nil, "", errors.New("mysqllock: URL parameter table is empty")
	}
	q.Del("mode")
	q.Del("table")
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(strings.Trim(u.Host, "[]"), "3306")
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" {
		return nil, "", errors.New("mysqllock: URL has no database (mysql://user@host:port/DATABASE)")
	}
	dsn := cfg.FormatDSN()
	if len(q) > 0 {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + q.Encode()
	}
	return o, dsn, nil
}

// Mode reports the driver's mode.
func (d *Driver) Mode() Mode { return d.mode }

func (d *Driver) check() error { return d.sess.Check() }

func (d *Driver) ensureSchema(ctx context.Context) error {
	d.schemaMu.Lock()
	defer d.schemaMu.Unlock()
	if d.schemaOK {
		return nil
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

// Renew implements driver.Driver. In ModeLease it is one UPDATE per 2,000
// leases sharing a TTL (one statement per tick in the common case); in the
// session modes it pings each pinned connection (in
// parallel) and reports ErrSessionLost for those that are gone.
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

// Close closes the connections pinned by held locks (which frees session
// locks on the server) and, if the driver opened the *sql.DB itself from a
// URL, closes it. Leases in ModeLease are left to expire. Close is
// idempotent.
func (d *Driver) Close() error {
	holds, first := d.sess.Close()
	if !first {
		return nil
	}
	d.sess.EndAll(holds)
	d.acquireStmt.close()
	d.releaseStmt.close()
	if d.ownDB {
		return d.db.Close()
	}
	return nil
}

// kill simulates a crash for the test harness: pinned connections are
// abandoned as they are (no release, no more traffic, so the server frees
// their locks when wait_timeout ends the sessions) and later calls fail.
// Close closes the abandoned connections.
func (d *Driver) kill() {
	d.sess.Kill()
	if d.ownDB {
		_ = d.db.Close()
	}
}
