package mysqllock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
)

// Inspect implements driver.Inspector. It lists the names in the lock table
// that start with prefix. In ModeLease a row is held while its lock_until is
// in the future. In ModeGetLock a name is held while IS_USED_LOCK reports a
// holder; in ModeRowLock while its row is locked (found with FOR UPDATE SKIP
// LOCKED, which for an instant conflicts with a concurrent NOWAIT attempt on
// the same row). Session-bound holders report ExpiresIn -1 and Count 1 (the
// re-entrance count lives in the holder's process). Waiters are not counted
// (-1).
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if err := d.ready(ctx); err != nil {
		return nil, err
	}
	p := hexLit(prefix)
	rows, err := d.db.QueryContext(ctx, fill(d.q.inspect, "{P}", p))
	if err != nil {
		return nil, fmt.Errorf("mysqllock: inspect: %w", err)
	}
	var out []driver.LockInfo
	for rows.Next() {
		var (
			li          driver.LockInfo
			name, owner []byte
			left        int64
		)
		if err := rows.Scan(&name, &owner, &li.Token, &li.Count, &left); err != nil {
			rows.Close()
			return nil, fmt.Errorf("mysqllock: inspect: %w", err)
		}
		li.Name, li.Owner = string(name), string(owner)
		li.ExpiresIn = time.Duration(left) * time.Microsecond
		li.Waiters = -1
		out = append(out, li)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysqllock: inspect: %w", err)
	}
	if d.mode == ModeLease {
		for i := range out {
			if out[i].ExpiresIn <= 0 {
				out[i].Owner, out[i].Count, out[i].ExpiresIn = "", 0, 0
			}
		}
		return out, nil
	}
	held := make([]bool, len(out))
	switch d.mode {
	case ModeGetLock:
		for start := 0; start < len(out); start += 200 {
			end := min(start+200, len(out))
			cols := make([]string, 0, end-start)
			for _, li := range out[start:end] {
				cols = append(cols, "IS_USED_LOCK("+hexLit(LockName(li.Name))+") IS NOT NULL")
			}
			vals := make([]any, len(cols))
			bs := make([]bool, len(cols))
			for i := range bs {
				vals[i] = &bs[i]
			}
			if err := d.db.QueryRowContext(ctx, "SELECT "+strings.Join(cols, ", ")).Scan(vals...); err != nil {
				return nil, fmt.Errorf("mysqllock: inspect: %w", err)
			}
			copy(held[start:end], bs)
		}
	case ModeRowLock:
		free, err := d.freeRows(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("mysqllock: inspect: %w", err)
		}
		for i, li := range out {
			held[i] = !free[li.Name]
		}
	}
	for i := range out {
		if held[i] {
			out[i].Count, out[i].ExpiresIn = 1, -1
		} else {
			out[i].Owner, out[i].Count, out[i].ExpiresIn = "", 0, 0
		}
	}
	return out, nil
}

// freeRows returns the names under prefix whose rows nobody has locked.
func (d *Driver) freeRows(ctx context.Context, p string) (map[string]bool, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, fill(d.q.inspectRow, "{P}", p))
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
	return free, rows.Err()
}
