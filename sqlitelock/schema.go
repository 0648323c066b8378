package sqlitelock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/openurl"
	"github.com/dlock/dlock/internal/standback"
)

// nowMS is SQLite's clock in milliseconds since the Unix epoch. SQLite
// keeps "now" fixed within one sqlite3_step call, so every use of it in one
// statement (whose writes and RETURNING rows all happen in its first step)
// sees the same instant. (julianday is used rather than unixepoch
// so that any SQLite with RETURNING runs it.)
const nowMS = `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`

// minVersion is the oldest SQLite the statements run on: RETURNING (3.35),
// UPDATE … FROM (3.33).
var minVersion = [3]int{3, 35, 0}

// newDriver checks db's SQLite version, creates the table if it is missing,
// checks its columns and prepares the fixed statements.
func newDriver(ctx context.Context, db *sql.DB, own bool, opts *Options) (*Driver, error) {
	table, busy, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	d := &Driver{db: db, ownDB: own, busy: busy, table: `"` + table + `"`, renewStmts: map[int]*sql.Stmt{}, stand: standback.New(),
		kinds: `"` + table + `_kinds"`, holders: `"` + table + `_holders"`}
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
	delay_until INTEGER NOT NULL,
	fence_floor INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID`
	if err := d.retryBusy(ctx, func() error { _, err := db.ExecContext(ctx, create); return err }); err != nil {
		return nil, fmt.Errorf("sqlitelock: create table %s: %w", table, err)
	}
	// A table of that name made by something else fails here, clearly,
	// rather than in the first TryAcquire.
	check := `SELECT name, owner, count, fence, updated_at, lock_until, delay_until FROM ` + t + ` LIMIT 0`
	if err := d.retryBusy(ctx, func() error { _, err := db.ExecContext(ctx, check); return err }); err != nil {
		return nil, openurl.Invalid("Table", "sqlitelock: table %s exists but is not a dlock table: %v", table, err)
	}
	if err := d.migrate(ctx, table); err != nil {
		return nil, err
	}

	// The companion file for wake-ups sits next to the main database file.
	var file string
	if err := d.retryBusy(ctx, func() error {
		return db.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file)
	}); err != nil {
		return nil, fmt.Errorf("sqlitelock: open database: %w", err)
	}
	d.sig = newSignal(file)

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
		THEN fence ELSE max(fence, fence_floor) + 1 END,
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
		// Held, for status, until it can be taken: to the end of its
		// lease, or of its lock-delay once the lease ran out unreleased.
		{&d.inspect, `SELECT name, owner, fence, count, max(lock_until, delay_until) - n.now
FROM ` + t + `, (SELECT ` + nowMS + ` AS now) AS n
WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name`},
	}
	for _, s := range stmts {
		st, err := db.PrepareContext(ctx, s.query)
		if err != nil {
			d.closeStmts()
			d.sig.close()
			return nil, fmt.Errorf("sqlitelock: prepare: %w", err)
		}
		*s.dst = st
	}
	return d, nil
}

// migrate brings a lock table made by an older version up to date, in
// place and idempotently (several processes may race to do it): the
// fence_floor column that RaiseFence sets on a held lock, and the kinds'
// tables (see internal/sqlcommon's kinds.go).
func (d *Driver) migrate(ctx context.Context, table string) error {
	var n int
	if err := d.retryBusy(ctx, func() error {
		return d.db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?1) WHERE name = 'fence_floor'`, table).Scan(&n)
	}); err != nil {
		return fmt.Errorf("sqlitelock: reading table %s: %w", table, err)
	}
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + d.kinds + ` (
	name    TEXT NOT NULL,
	grp     INTEGER NOT NULL,
	fence   INTEGER NOT NULL DEFAULT 0,
	permits INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (name, grp)
) WITHOUT ROWID`,
		`CREATE TABLE IF NOT EXISTS ` + d.holders + ` (
	name        TEXT NOT NULL,
	grp         INTEGER NOT NULL,
	owner       TEXT NOT NULL,
	kind        INTEGER NOT NULL,
	count       INTEGER NOT NULL,
	fence       INTEGER NOT NULL,
	lock_until  INTEGER NOT NULL,
	delay_until INTEGER NOT NULL,
	PRIMARY KEY (name, grp, owner, kind)
) WITHOUT ROWID`,
	}
	if n == 0 {
		stmts = append([]string{`ALTER TABLE ` + d.table + ` ADD COLUMN fence_floor INTEGER NOT NULL DEFAULT 0`}, stmts...)
	}
	for _, s := range stmts {
		err := d.retryBusy(ctx, func() error { _, err := d.db.ExecContext(ctx, s); return err })
		if err != nil && !strings.Contains(err.Error(), "duplicate column name") {
			return fmt.Errorf("sqlitelock: updating the schema of table %s: %w", table, err)
		}
	}
	return nil
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
