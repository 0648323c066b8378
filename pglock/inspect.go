package pglock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
)

// Inspect implements driver.Inspector. It lists the names in the lock table
// that start with prefix. In ModeLease a row is held while its lock_until is
// in the future. In ModeAdvisory a name is held while pg_locks shows its
// advisory key granted; in ModeRowLock while its row is locked (found with
// FOR KEY SHARE SKIP LOCKED, which for an instant conflicts with a
// concurrent NOWAIT attempt on the same row). Session-bound holders report
// ExpiresIn -1 and Count 1 (the re-entrance count lives in the holder's
// process). Waiters are not counted (-1).
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if err := d.ready(ctx); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, d.q.inspect, prefix)
	if err != nil {
		return nil, fmt.Errorf("pglock: inspect: %w", err)
	}
	var out []driver.LockInfo
	for rows.Next() {
		var (
			li    driver.LockInfo
			fence int64
			left  int64
		)
		if err := rows.Scan(&li.Name, &li.Owner, &fence, &li.Count, &left); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pglock: inspect: %w", err)
		}
		li.Token = uint64(fence)
		li.ExpiresIn = time.Duration(left) * time.Microsecond
		li.Waiters = -1
		out = append(out, li)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pglock: inspect: %w", err)
	}
	if d.mode == ModeLease {
		for i := range out {
			if out[i].ExpiresIn <= 0 {
				out[i].Owner, out[i].Count, out[i].ExpiresIn = "", 0, 0
			}
		}
		return out, nil
	}
	held := map[string]bool{}
	switch d.mode {
	case ModeAdvisory:
		keys := map[int64]bool{}
		rows, err := d.pool.Query(ctx, d.q.inspectAdvisory)
		if err != nil {
			return nil, fmt.Errorf("pglock: inspect: %w", err)
		}
		for rows.Next() {
			var k int64
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return nil, fmt.Errorf("pglock: inspect: %w", err)
			}
			keys[k] = true
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("pglock: inspect: %w", err)
		}
		for _, li := range out {
			held[li.Name] = keys[AdvisoryKey(li.Name)]
		}
	case ModeRowLock:
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("pglock: inspect: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		rows, err := tx.Query(ctx, d.q.inspectRow, prefix)
		if err != nil {
			return nil, fmt.Errorf("pglock: inspect: %w", err)
		}
		free := map[string]bool{}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				rows.Close()
				return nil, fmt.Errorf("pglock: inspect: %w", err)
			}
			free[n] = true
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("pglock: inspect: %w", err)
		}
		for _, li := range out {
			held[li.Name] = !free[li.Name]
		}
	}
	for i := range out {
		if held[out[i].Name] {
			out[i].Count, out[i].ExpiresIn = 1, -1
		} else {
			out[i].Owner, out[i].Count, out[i].ExpiresIn = "", 0, 0
		}
	}
	return out, nil
}
