package pglock

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Inspect implements driver.Inspector. It lists the names in the lock table
// that start with prefix. In ModeLease a row is held while its lock_until is
// in the future, or, when its lease ran out unreleased, its delay_until:
// ExpiresIn is the time until the lock can be taken (lease plus lock-delay). In ModeAdvisory a name is held while pg_locks shows its
// advisory key granted (its grants write nothing to the row: Owner and
// Token come from this driver's own holds, or from another process's
// holder's last renewal ping, read in pg_stat_activity, so such a hold is
// listed with no owner and token 0 until its first renewal, a third of its
// TTL after the grant, and always when the inspecting role may not read
// other sessions' statements); in ModeRowLock while its row is locked (found with
// FOR KEY SHARE SKIP LOCKED, which for an instant conflicts with a
// concurrent NOWAIT attempt on the same row). Session-bound holders report
// ExpiresIn -1 and Count 1 (the re-entrance count lives in the holder's
// process). In ModeAdvisory a mutex's Waiters counts the Locks waiting for
// it in the server (pg_advisory_lock), which is where they wait while
// their pool can spare a connection; a Lock woken by NOTIFY instead is not
// counted. Other waiters are not counted (-1). The read/write locks (and, in
// ModeLease, semaphores) under prefix follow each name's mutex (see
// driver.LockInfo); in ModeRowLock a read/write lock held only by readers
// is listed as free (shared row locks are not visible).
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	list := func(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
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
	return d.base.Inspect(ctx, prefix, d.sess != nil, list, d.held)
}

// list reads the lock table's rows under prefix.
func (d *store) list(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	rows, err := d.pool.Query(ctx, d.q.inspect, prefix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return sqlcommon.ScanLocks(rows)
}

// held reports the names in out whose advisory keys pg_locks shows
// granted: a mutex by its AdvisoryKey, a read/write lock by its RWKey
// (with its readers counted), and sets each mutex's Waiters to the
// sessions waiting for its key in the server. own is the driver's holds.
func (a advisory) held(ctx context.Context, own *sqlcommon.Sessions[*pinned], out []driver.LockInfo) ([]bool, error) {
	rows, err := a.pool.Query(ctx, a.q.inspectAdvisoryModes)
	if err != nil {
		return nil, err
	}
	locks := map[int64][2]int{} // key → shared, exclusive holders
	marks := map[int64]string{} // key → its exclusive holder's last statement
	waiting := map[int64]int{}  // key → sessions waiting for it exclusively
	var (
		key             int64
		shared, granted bool
		query           string
	)
	_, err = pgx.ForEachRow(rows, []any{&key, &shared, &granted, &query}, func() error {
		if !granted {
			if !shared {
				waiting[key]++
			}
			return nil
		}
		n := locks[key]
		if shared {
			n[0]++
		} else {
			n[1]++
			marks[key] = query
		}
		locks[key] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	held := make([]bool, len(out))
	for i, li := range out {
		held[i] = locks[AdvisoryKey(li.Name)][1] > 0
		if li.Kind != driver.Exclusive {
			continue
		}
		out[i].Waiters = waiting[AdvisoryKey(li.Name)]
		// A grant writes nothing to its row (the token comes from the
		// table's sequences): the row's owner and fence are not the
		// holder's. The driver knows its own holds; another's names
		// itself in its renewal pings (see holdMarker), and is reported
		// with no owner and token 0 until its first.
		out[i].Owner, out[i].Token = "", 0
		if !held[i] {
			continue
		}
		if h := own.Get(li.Name); h != nil {
			out[i].Owner, out[i].Token = h.Owner(), h.Token()
		} else if tok, owner, ok := parseHoldMarker(marks[AdvisoryKey(li.Name)]); ok {
			out[i].Owner, out[i].Token = owner, tok
		}
	}
	heldKinds(out, held, locks)
	return held, nil
}

// held reports the names in out whose rows are locked: those FOR KEY SHARE
// SKIP LOCKED skips. A read/write lock is held while a writer holds its
// RowKey row (FOR SHARE SKIP LOCKED skips it); readers are not seen.
func (r rowLock) held(ctx context.Context, prefix string, out []driver.LockInfo) ([]bool, error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	free, err := collectSet[string](tx.Query(ctx, r.q.inspectRow, prefix))
	if err != nil {
		return nil, err
	}
	held := sqlcommon.HeldUnlessFree(out, free)
	var keys []string
	for _, li := range out {
		if li.Kind == driver.Write {
			keys = append(keys, RowKey(li.Name))
		}
	}
	if len(keys) == 0 {
		return held, nil
	}
	unwritten, err := collectSet[string](tx.Query(ctx, r.q.inspectRowWriters, keys))
	if err != nil {
		return nil, err
	}
	for i, li := range out {
		if li.Kind == driver.Write {
			held[i] = !unwritten[RowKey(li.Name)]
		}
	}
	return held, nil
}

// collectSet reads the one-column rows of a query (the result of Query,
// passed as it is) into a set.
func collectSet[T comparable](rows pgx.Rows, err error) (map[T]bool, error) {
	if err != nil {
		return nil, err
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		return nil, err
	}
	set := make(map[T]bool, len(vs))
	for _, v := range vs {
		set[v] = true
	}
	return set, nil
}
