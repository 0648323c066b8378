package mysqllock

import (
	"context"
	"strings"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Inspect implements driver.Inspector. It lists the names in the lock table
// that start with prefix. In ModeLease a row is held while its lock_until is
// in the future, or, when its lease ran out unreleased, its delay_until:
// ExpiresIn is the time until the lock can be taken (lease plus lock-delay). In ModeGetLock a name is held while IS_USED_LOCK reports a
// holder; in ModeRowLock while its row is locked (found with FOR UPDATE SKIP
// LOCKED, which for an instant conflicts with a concurrent NOWAIT attempt on
// the same row). Session-bound holders report ExpiresIn -1 and Count 1 (the
// re-entrance count lives in the holder's process). Waiters are not counted
// (-1). In ModeLease the read/write locks and semaphores under prefix
// follow each name's mutex (see driver.LockInfo).
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	list := d.list
	if d.mode == ModeLease {
		list = func(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
			out, err := d.list(ctx, prefix)
			if err != nil {
				return nil, err
			}
			kinds, err := d.inspectKinds(ctx, prefix)
			if err != nil {
				return nil, err
			}
			return sqlcommon.MergeInfos(out, kinds), nil
		}
	}
	return d.base.Inspect(ctx, prefix, d.sess != nil, list, d.held)
}

// list reads the lock table's rows under prefix.
func (d *store) list(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	rows, err := d.db.QueryContext(ctx, fill(d.q.inspect, "{P}", hexLit(prefix)))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return sqlcommon.ScanLocks(rows)
}

// held reports the names in out for which IS_USED_LOCK names a holder, 200
// names a statement.
func (g getLock) held(ctx context.Context, _ string, out []driver.LockInfo) ([]bool, error) {
	held := make([]bool, len(out))
	for start := 0; start < len(out); start += 200 {
		end := min(start+200, len(out))
		cols := make([]string, 0, end-start)
		for _, li := range out[start:end] {
			cols = append(cols, "IS_USED_LOCK("+hexLit(LockName(li.Name))+") IS NOT NULL")
		}
		vals := make([]any, len(cols))
		for i := range vals {
			vals[i] = &held[start+i]
		}
		if err := g.db.QueryRowContext(ctx, "SELECT "+strings.Join(cols, ", ")).Scan(vals...); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// held reports the names in out whose rows are locked: those FOR UPDATE
// SKIP LOCKED skips.
func (r rowLock) held(ctx context.Context, prefix string, out []driver.LockInfo) ([]bool, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, fill(r.q.inspectRow, "{P}", hexLit(prefix)))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	free := map[string]bool{}
	for rows.Next() {
		var n []byte
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		free[string(n)] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return sqlcommon.HeldUnlessFree(out, free), nil
}
