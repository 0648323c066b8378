package sqlitelock

import (
	"context"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Inspect lists the locks whose names start with prefix, sorted by name
// (and kind: a name's mutex, read/write lock and semaphore are listed
// apart, see driver.LockInfo). A mutex is reported held until it can be
// taken: ExpiresIn is the lease's time left plus its lock-delay, and a
// holder whose lease ran out unreleased is still shown while its
// lock-delay keeps others out. A released lock, or one past both, is
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
	kinds, err := d.inspectKinds(ctx, prefix)
	if err != nil {
		return nil, d.wrap(ctx, "inspect", err)
	}
	return sqlcommon.MergeInfos(out, kinds), nil
}
