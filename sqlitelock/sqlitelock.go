package sqlitelock

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/standback"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Defaults for Options.
const (
	// DefaultTable is the table that holds lock rows.
	DefaultTable = "dlock_locks"
	// DefaultBusyTimeout is how long a statement waits for another
	// connection's write lock on the file before it fails.
	DefaultBusyTimeout = 5 * time.Second
)

// Options configures a Driver. A nil *Options, and every zero field, means
// the default. Each field is also a URL query parameter, named in its
// comment.
type Options struct {
	// Table is the name of the table holding one row per lock (URL: table).
	// It must be a plain SQL identifier: a letter or underscore, then up to
	// 62 letters, digits or underscores. It is created if missing.
	// Default DefaultTable.
	Table string
	// BusyTimeout is how long a statement waits for the file's write lock
	// while another connection or process holds it (URL: busy_timeout, a
	// Go duration such as "5s"). Must not be negative. Default
	// DefaultBusyTimeout.
	BusyTimeout time.Duration
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

func (o *Options) resolve() (table string, busy time.Duration, err error) {
	table, busy = DefaultTable, DefaultBusyTimeout
	if o == nil {
		return table, busy, nil
	}
	if o.Table != "" {
		if !identRE.MatchString(o.Table) {
			return "", 0, openurl.Invalid("Table", "sqlitelock: invalid table name %q: want a letter or underscore followed by up to 62 letters, digits or underscores", o.Table)
		}
		table = o.Table
	}
	if o.BusyTimeout < 0 {
		return "", 0, openurl.Invalid("BusyTimeout", "sqlitelock: invalid busy timeout %v: must not be negative", o.BusyTimeout)
	}
	if o.BusyTimeout > 0 {
		busy = o.BusyTimeout
	}
	return table, busy, nil
}

// Driver is a dlock driver over one SQLite database. It implements
// driver.Driver, driver.Inspector, driver.Limiter, driver.Notifier,
// driver.Kinder (every kind), driver.Withdrawer, driver.MultiAcquirer,
// driver.FenceRaiser and driver.Quiescer. It is safe for concurrent use.
type Driver struct {
	db    *sql.DB
	ownDB bool // opened by Open: closed by Close
	busy  time.Duration

	table                                        string // quoted
	kinds, holders                               string // the kinds' tables, quoted
	acquire, info, releaseLast, release, inspect *sql.Stmt

	sig *signal // wake-up signals; nil when the database has no file
	// stand records the waiting Locks the table refused, which are exempt
	// from the stand-back (see signal.yielding and standback.StandBack).
	stand *standback.StandBack
	// testHookStandBack, set only by tests before first use, runs when an
	// attempt starts to stand back.
	testHookStandBack func()

	gate gate // holds statements back while quiesced (see Quiesce)

	renewMu    sync.Mutex
	renewStmts map[int]*sql.Stmt // by batch size, see renewSizes

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var (
	_ driver.Driver    = (*Driver)(nil)
	_ driver.Inspector = (*Driver)(nil)
	_ driver.Limiter   = (*Driver)(nil)
	_ driver.Notifier  = (*Driver)(nil)
)

// errClosed is returned by every call after Close. It wraps
// dlock.ErrClosed, as the other drivers' do, so that a waiting Lock on a
// closed driver ends rather than retrying.
var errClosed = fmt.Errorf("sqlitelock: driver is closed: %w", dlock.ErrClosed)

// New returns a driver that keeps its locks in db, creating the table if it
// is missing. db may use any SQLite database/sql driver whose SQLite is 3.35
// or newer; Close does not close it.
//
// Every write the driver makes is a statement (or, for renewals of more than
// 256 leases, a transaction) that takes SQLite's write lock before it reads,
// which SQLite serialises safely whatever the journal mode; a statement that
// finds the file busy is retried for up to opts.BusyTimeout. For throughput,
// and so that goroutines queue in database/sql rather than in SQLite's
// sleeping busy handler, put the database in WAL mode and give it one
// connection (SetMaxOpenConns(1)), as Open does. The durability of grants,
// and so of fencing tokens across a power loss, is what db's settings give
// (Open uses synchronous=FULL).
//
// A nil db or a bad Options field is refused with an error wrapping
// driver.ErrInvalid.
func New(db *sql.DB, opts *Options) (*Driver, error) {
	if db == nil {
		return nil, openurl.Invalid("db", "sqlitelock: New: db is nil")
	}
	return newDriver(context.Background(), db, false, opts)
}

// Open opens (creating it, and its parent directories, if missing) the
// SQLite file at path and returns a driver over it. The file is put in WAL
// mode with synchronous=FULL and the busy timeout of opts. Close closes the
// file. path must not be empty; ":memory:" and SQLite URI filenames are not
// accepted (locks in memory are not shared between processes: use memlock).
// Bad input is refused with an error wrapping driver.ErrInvalid.
func Open(path string, opts *Options) (*Driver, error) {
	return openPath(context.Background(), path, opts)
}

func openPath(ctx context.Context, path string, opts *Options) (*Driver, error) {
	_, busy, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, openurl.Invalid("path", "sqlitelock: Open: path is empty")
	}
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, openurl.Invalid("path", "sqlitelock: Open: %q is not a file path", path)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return nil, openurl.Invalid("path", "sqlitelock: Open: path contains a NUL byte")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlitelock: Open: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return nil, fmt.Errorf("sqlitelock: Open: create directory: %w", err)
	}
	if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
		return nil, openurl.Invalid("path", "sqlitelock: Open: %s is a directory", abs)
	}
	q := url.Values{}
	// SQLite sleeps at most busyStep for the write lock; retryBusy retries
	// for the rest of the busy timeout.
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(ms(min(busy, busyStep)), 10)+")")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Set("_txlock", "immediate")
	dsn := (&url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlitelock: Open %s: %w", abs, err)
	}
	// One connection: goroutines of this process queue in database/sql
	// instead of contending for the file lock through SQLite's sleeping
	// busy handler. Other processes still contend through the file lock,
	// tried every busyStep (see retryBusy).
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(0)
	db.SetConnMaxLifetime(0)
	d, err := newDriver(ctx, db, true, opts)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("%w (file %s)", err, abs)
	}
	return d, nil
}

// Limits reports that leases are kept in whole milliseconds.
func (d *Driver) Limits() driver.Limits {
	return driver.Limits{MinTTL: time.Millisecond, TTLGranularity: time.Millisecond}
}

// Close releases the driver's prepared statements and, when the driver was
// made by Open (or a sqlite:// URL), closes the database. It does not
// release locks: leases still held expire by their TTL. A *sql.DB given to
// New is left open. Close is idempotent.
func (d *Driver) Close() error {
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		d.sig.close()
		d.closeStmts()
		if d.ownDB {
			if err := d.db.Close(); err != nil {
				d.closeErr = fmt.Errorf("sqlitelock: close: %w", err)
			}
		}
	})
	return d.closeErr
}

func (d *Driver) closeStmts() {
	for _, s := range []*sql.Stmt{d.acquire, d.info, d.releaseLast, d.release, d.inspect} {
		if s != nil {
			s.Close()
		}
	}
	d.renewMu.Lock()
	for k, s := range d.renewStmts {
		s.Close()
		delete(d.renewStmts, k)
	}
	d.renewMu.Unlock()
}

// name returns the lock table's name unquoted (it is a plain identifier).
func (d *Driver) name() string { return strings.Trim(d.table, `"`) }
