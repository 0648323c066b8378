package sqlitelock

import (
	"context"
	"database/sql"
)

// acquireReleaseFloor is the cheapest take-and-free of a key with bare
// SQLite: an INSERT OR REPLACE and a DELETE on a separate table, each its
// own (autocommit) write transaction, as prepared statements on db.
func acquireReleaseFloor(ctx context.Context, db *sql.DB) (func(context.Context, string) error, func(), error) {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS dlock_floor (k TEXT PRIMARY KEY, v TEXT, t INTEGER) WITHOUT ROWID`); err != nil {
		return nil, nil, err
	}
	ins, err := db.PrepareContext(ctx, `INSERT OR REPLACE INTO dlock_floor (k, v, t) VALUES (?1, ?2, ?3)`)
	if err != nil {
		return nil, nil, err
	}
	del, err := db.PrepareContext(ctx, `DELETE FROM dlock_floor WHERE k = ?1`)
	if err != nil {
		ins.Close()
		return nil, nil, err
	}
	op := func(ctx context.Context, key string) error {
		if _, err := ins.ExecContext(ctx, key, "owner", 1); err != nil {
			return err
		}
		_, err := del.ExecContext(ctx, key)
		return err
	}
	return op, func() { ins.Close(); del.Close() }, nil
}
