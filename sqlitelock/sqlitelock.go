package sqlitelock

import (
	"context"
	"database/sql"
	"errors"
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
			return "", 0, invalidf("invalid table name %q: want a letter or underscore followed by up to 62 letters, digits or underscores", o.Table)
		}
		table = o.Table
	}
	if o.BusyTimeout < 0 {
		return "", 0, invalidf("invalid busy timeout %v: must not be negative", o.BusyTimeout)
	}
	if o.BusyTimeout > 0 {
		busy = o.BusyTimeout
	}
	return table, busy, nil
}

// Driver is a dlock driver over one SQLite database. It implements
// driver.Driver, driver.Inspector and driver.Limiter. It is safe for
// concurrent use.
type Driver struct {
	db    *sql.DB
	ownDB bool // opened by Open: closed by Close
	busy  time.Duration

	table                                        string // quoted
	acquire, info, releaseLast, release, inspect *sql.Stmt

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
)

// invalidError is bad input to a constructor or in a URL. It wraps
// dlock.ErrInvalid, so dlock.Open reports it as an invalid URL.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return "sqlitelock: " + e.msg }
func (e *invalidError) Unwrap() error { return dlock.ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// errClosed is returned by every call after Close.
var errClosed = errors.New("sqlitelock: driver is closed")

// nowMS is SQLite's clock in milliseconds since the Unix epoch. SQLite
// keeps "now" fixed within one sqlite3_step call, so every use of it in one
// statement (whose writes and RETURNING rows all happen in its first step)
// sees the same instant. (julianday is used rather than unixepoch
// so that any SQLite with RETURNING runs it.)
const nowMS = `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`

// minVersion is the oldest SQLite the statements run on: RETURNING (3.35),
// UPDATE … FROM (3.33).
var minVersion = [3]int{3, 35, 0}

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
func New(db *sql.DB, opts *Options) (*Driver, error) {
	if db == nil {
		return nil, invalidf("New: db is nil")
	}
	return newDriver(context.Background(), db, false, opts)
}

// Open opens (creating it, and its parent directories, if missing) the
// SQLite file at path and returns a driver over it. The file is put in WAL
// mode with synchronous=FULL and the busy timeout of opts. Close closes the
// file. path must not be empty; ":memory:" and SQLite URI filenames are not
// accepted (locks in memory are not shared between processes: use memlock).
func Open(path string, opts *Options) (*Driver, error) {
	return openPath(context.Background(), path, opts)
}

func openPath(ctx context.Context, path string, opts *Options) (*Driver, error) {
	_, busy, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalidf("Open: path is empty")
	}
	if path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, invalidf("Open: %q is not a file path", path)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return nil, invalidf("Open: path contains a NUL byte")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlitelock: Open: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return nil, fmt.Errorf("sqlitelock: Open: create directory: %w", err)
	}
	if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
		return nil, invalidf("Open: %s is a directory", abs)
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout("+strconv.FormatInt(ms(busy), 10)+")")
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
	// busy handler. Other processes still contend through the file lock and
	// the busy timeout.
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

func newDriver(ctx context.Context, db *sql.DB, own bool, opts *Options) (*Driver, error) {
	table, busy, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	d := &Driver{db: db, ownDB: own, busy: busy, table: `"` + table + `"`, renewStmts: map[int]*sql.Stmt{}}
	var version string
	if err := d.retryBusy(ctx, func() error {
		return db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&version)
	}); err != nil {
		return nil, fmt.Errorf("sqlitelock: open database: %w", err)
	}
	if !versionAtLeast(version, minVersion) {
		return nil, fmt.Errorf("sqlitelock: SQLite %s is too old: need %d.%d.%d or newer", version, minVersion[0], minVersion[1], minVersion[2])
	}
	t := d.table
	create := `CREATE TABLE IF NOT EXISTS ` + t + ` (
	name        TEXT PRIMARY KEY NOT NULL,
	owner       TEXT NOT NULL DEFAULT '',
	count       INTEGER NOT NULL DEFAULT 0,
	fence       INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL,
	lock_until  INTEGER NOT NULL,
	delay_until INTEGER NOT NULL
) WITHOUT ROWID`
	if err := d.retryBusy(ctx, func() error { _, err := db.ExecContext(ctx, create); return err }); err != nil {
		return nil, fmt.Errorf("sqlitelock: create table %s: %w", table, err)
	}
	// A table of that name made by something else fails here, clearly,
	// rather than in the first TryAcquire.
	check := `SELECT name, owner, count, fence, updated_at, lock_until, delay_until FROM ` + t + ` LIMIT 0`
	if err := d.retryBusy(ctx, func() error { _, err := db.ExecContext(ctx, check); return err }); err != nil {
		return nil, invalidf("table %s exists but is not a dlock table: %v", table, err)
	}

	stmts := []struct {
		dst   **sql.Stmt
		query string
	}{
		// In DO UPDATE, bare column names are the existing row's and
		// excluded.* the new one's; excluded.updated_at is now.
		{&d.acquire, `INSERT INTO ` + t + ` (name, owner, count, fence, updated_at, lock_until, delay_until)
VALUES (?1, ?2, 1, 1, ` + nowMS + `, ` + nowMS + ` + ?3, ` + nowMS + ` + ?3 + ?4)
ON CONFLICT (name) DO UPDATE SET
	count = CASE WHEN count > 0 AND owner = excluded.owner AND excluded.updated_at < lock_until
		THEN count + 1 ELSE 1 END,
	fence = CASE WHEN count > 0 AND owner = excluded.owner AND excluded.updated_at < lock_until
		THEN fence ELSE fence + 1 END,
	owner = excluded.owner,
	updated_at = excluded.updated_at,
	lock_until = excluded.lock_until,
	delay_until = excluded.delay_until
WHERE count = 0
	OR excluded.updated_at >= delay_until
	OR (count > 0 AND owner = excluded.owner AND excluded.updated_at < lock_until)
RETURNING fence, count`},
		{&d.info, `SELECT fence, count, max(lock_until, delay_until) - ` + nowMS + ` FROM ` + t + ` WHERE name = ?1`},
		// The common release, of the last hold, needs no RETURNING
		// (which costs a measurable share of an uncontended lock).
		{&d.releaseLast, `UPDATE ` + t + ` SET
	count = 0, owner = '', updated_at = ` + nowMS + `, lock_until = ` + nowMS + `, delay_until = ` + nowMS + `
WHERE name = ?1 AND owner = ?2 AND (?3 = 0 OR fence = ?3) AND count = 1 AND ` + nowMS + ` < lock_until`},
		{&d.release, `UPDATE ` + t + ` SET
	count = count - 1,
	owner = CASE WHEN count > 1 THEN owner ELSE '' END,
	updated_at = ` + nowMS + `,
	lock_until = CASE WHEN count > 1 THEN lock_until ELSE ` + nowMS + ` END,
	delay_until = CASE WHEN count > 1 THEN delay_until ELSE ` + nowMS + ` END
WHERE name = ?1 AND owner = ?2 AND (?3 = 0 OR fence = ?3) AND count > 0 AND ` + nowMS + ` < lock_until
RETURNING count`},
		{&d.inspect, `SELECT name, owner, fence, count, lock_until - n.now
FROM ` + t + `, (SELECT ` + nowMS + ` AS now) AS n
WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name`},
	}
	for _, s := range stmts {
		st, err := db.PrepareContext(ctx, s.query)
		if err != nil {
			d.closeStmts()
			return nil, fmt.Errorf("sqlitelock: prepare: %w", err)
		}
		*s.dst = st
	}
	return d, nil
}

func versionAtLeast(v string, min [3]int) bool {
	parts := strings.SplitN(v, ".", 3)
	for i := 0; i < 3; i++ {
		n := 0
		if i < len(parts) {
			var err error
			if n, err = strconv.Atoi(parts[i]); err != nil {
				return false
			}
		}
		if n != min[i] {
			return n > min[i]
		}
	}
	return true
}

// ms converts a duration to whole milliseconds, rounding up.
func ms(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// TryAcquire makes one attempt to take or re-enter req.Name in a single
// statement. When another owner holds the lock (or it is within its
// lock-delay) it returns a *driver.LockedError whose RetryAfter is the time
// until the lease plus lock-delay ends by SQLite's clock.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.closed.Load() {
		return driver.Grant{}, errClosed
	}
	ttl, delay := ms(req.TTL), ms(req.LockDelay)
	if ttl < 1 {
		ttl = 1
	}
	var fence int64
	var count int
	err := d.retryBusy(ctx, func() error {
		return d.acquire.QueryRowContext(ctx, req.Name, req.Owner, ttl, delay).Scan(&fence, &count)
	})
	if err == nil {
		return driver.Grant{Token: uint64(fence), Count: count, TTL: time.Duration(ttl) * time.Millisecond}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return driver.Grant{}, d.wrap(ctx, "acquire", err)
	}
	// Held by someone else. Read the holder's token and remaining time for
	// the retry hint; this is a second statement, so the row may have
	// changed since: the hint is then merely stale, never unsafe.
	var left int64
	err = d.retryBusy(ctx, func() error {
		return d.info.QueryRowContext(ctx, req.Name).Scan(&fence, &count, &left)
	})
	le := &driver.LockedError{}
	if err == nil {
		le.Token = uint64(fence)
		if count > 0 || left > 0 {
			le.RetryAfter = time.Duration(max(left, 0)) * time.Millisecond
		}
	}
	return driver.Grant{}, le
}

// Release gives up one hold of l.Name by l.Owner under l.Token. When the
// count reaches zero the lock is free at once (no lock-delay). When the row
// no longer carries this owner and token, or the lease has expired by
// SQLite's clock, it changes nothing and returns an error wrapping
// driver.ErrNotHeld: an expired lease ended without a release, so its
// lock-delay runs in full, and the caller learns that its lease lapsed. A
// zero l.Token (the dlock package cleaning up after a TryAcquire whose
// outcome is unknown) matches whatever l.Owner holds.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	var count int
	err := d.retryBusy(ctx, func() error {
		res, err := d.releaseLast.ExecContext(ctx, l.Name, l.Owner, int64(l.Token))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 1 {
			count = 0
			return nil
		}
		// Re-entered (count > 1), or not held: one more statement says
		// which, atomically on its own.
		return d.release.QueryRowContext(ctx, l.Name, l.Owner, int64(l.Token)).Scan(&count)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("sqlitelock: release %q: %w", l.Name, driver.ErrNotHeld)
	}
	if err != nil {
		return 0, d.wrap(ctx, "release", err)
	}
	return count, nil
}

type renewItem struct {
	name, owner string
	fence       int64
}

// renewSizes are the batch sizes Renew prepares statements for. A batch is
// cut into chunks of the largest size, and the last chunk is padded up to
// the next size by repeating its last lease (an UPDATE … FROM matches each
// row once, so a repeat changes nothing). Five prepared statements then
// serve every batch size; padding at most quadruples the rows of a small
// batch, and adds under 256 to a large one.
var renewSizes = []int{1, 4, 16, 64, 256}

// renewStmt returns the prepared renewal statement for k leases.
func (d *Driver) renewStmt(ctx context.Context, k int) (*sql.Stmt, error) {
	d.renewMu.Lock()
	defer d.renewMu.Unlock()
	if st := d.renewStmts[k]; st != nil {
		return st, nil
	}
	if d.closed.Load() {
		return nil, errClosed
	}
	t := d.table
	vals := strings.TrimSuffix(strings.Repeat("(?,?,?,?,?),", k), ",")
	st, err := d.db.PrepareContext(ctx, `WITH b(name, owner, fence, ttl, delay) AS (VALUES `+vals+`)
UPDATE `+t+` SET
	updated_at = n.now,
	lock_until = n.now + b.ttl,
	delay_until = n.now + b.ttl + b.delay
FROM (SELECT `+nowMS+` AS now) AS n, b
WHERE `+t+`.name = b.name AND `+t+`.owner = b.owner AND `+t+`.fence = b.fence
	AND `+t+`.count > 0 AND n.now < `+t+`.lock_until
RETURNING name, owner, fence`)
	if err != nil {
		return nil, err
	}
	d.renewStmts[k] = st
	return st, nil
}

// Renew extends every lease in ls to its TTL from now, by SQLite's clock,
// in one transaction (one statement per 256 leases). A lease whose row no
// longer has its owner and token, or whose lease has already expired, gets
// an error wrapping driver.ErrNotHeld: an expired lease is never revived.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	errs := make([]error, len(ls))
	if len(ls) == 0 {
		return errs, nil
	}
	args := make([]any, 0, 5*min(len(ls), renewSizes[len(renewSizes)-1]))
	renewed := make(map[renewItem]bool, len(ls))
	// Prepare every statement the batch needs before a transaction takes
	// the connection (Open's pool has only one).
	big := renewSizes[len(renewSizes)-1]
	type part struct {
		ls   []driver.Lease
		size int
		st   *sql.Stmt
	}
	var parts []part
	for start := 0; start < len(ls); start += big {
		p := part{ls: ls[start:min(start+big, len(ls))], size: big}
		for _, s := range renewSizes {
			if s >= len(p.ls) {
				p.size = s
				break
			}
		}
		var err error
		if p.st, err = d.renewStmt(ctx, p.size); err != nil {
			return nil, d.wrap(ctx, "renew", err)
		}
		parts = append(parts, p)
	}
	chunk := func(ctx context.Context, tx *sql.Tx, p part) error {
		st, part, size := p.st, p.ls, p.size
		if tx != nil {
			st = tx.StmtContext(ctx, st)
			defer st.Close()
		}
		args = args[:0]
		for i := 0; i < size; i++ {
			l := part[min(i, len(part)-1)]
			args = append(args, l.Name, l.Owner, int64(l.Token), max(ms(l.TTL), 1), ms(l.LockDelay))
		}
		rows, err := st.QueryContext(ctx, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var it renewItem
			if err := rows.Scan(&it.name, &it.owner, &it.fence); err != nil {
				return err
			}
			renewed[it] = true
		}
		return rows.Err()
	}
	err := d.retryBusy(ctx, func() error {
		clear(renewed)
		if len(parts) == 1 {
			return chunk(ctx, nil, parts[0])
		}
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if err := chunk(ctx, tx, p); err != nil {
				tx.Rollback()
				return err
			}
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, d.wrap(ctx, "renew", err)
	}
	for i, l := range ls {
		if !renewed[renewItem{l.Name, l.Owner, int64(l.Token)}] {
			errs[i] = fmt.Errorf("sqlitelock: renew %q: %w", l.Name, driver.ErrNotHeld)
		}
	}
	return errs, nil
}

// Inspect lists the locks whose names start with prefix, sorted by name. A
// lock whose lease has expired (even if still inside its lock-delay) is
// reported free: no owner, count 0, ExpiresIn 0. Waiters is always -1:
// SQLite does not know who polls.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	var out []driver.LockInfo
	err := d.retryBusy(ctx, func() error {
		out = out[:0]
		rows, err := d.inspect.QueryContext(ctx, prefix)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var li driver.LockInfo
			var fence, left int64
			if err := rows.Scan(&li.Name, &li.Owner, &fence, &li.Count, &left); err != nil {
				return err
			}
			li.Token = uint64(fence)
			li.Waiters = -1
			if li.Count > 0 && left > 0 {
				li.ExpiresIn = time.Duration(left) * time.Millisecond
			} else {
				li.Owner, li.Count = "", 0
			}
			out = append(out, li)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, d.wrap(ctx, "inspect", err)
	}
	return out, nil
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

// wrap adds context to a failed statement. When ctx is done the error wraps
// ctx.Err() as well, whatever SQLite reported (an interrupt).
func (d *Driver) wrap(ctx context.Context, op string, err error) error {
	if d.closed.Load() {
		return fmt.Errorf("%w: %s: %w", errClosed, op, err)
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("sqlitelock: %s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("sqlitelock: %s: %w", op, err)
}

// isBusy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED: the
// statement did not run because another connection held a lock.
func isBusy(err error) bool {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "SQLITE_BUSY")
}

// retryBusy runs fn, and runs it again while it fails with SQLITE_BUSY, for
// up to the busy timeout. A connection opened by Open waits inside SQLite
// already (busy_timeout pragma), so this matters for a *sql.DB the user gave
// to New without one.
func (d *Driver) retryBusy(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(d.busy)
	wait := time.Millisecond
	for {
		err := fn()
		if err == nil || !isBusy(err) || ctx.Err() != nil {
			return err
		}
		if time.Until(deadline) <= 0 {
			return err
		}
		t := time.NewTimer(min(wait, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}
