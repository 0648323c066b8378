package sqlitelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Read/write locks and semaphores (driver.Kinder) live in two tables next
// to the lock table, <table>_kinds and <table>_holders, laid out and
// decided as internal/sqlcommon's kinds.go describes: an acquire is one
// transaction that upserts the lock's _kinds row first (SQLite's write
// lock serialises it with every other writer of the file), reads its
// holders and writes what sqlcommon.DecideKind asks for; a release or a
// renewal is a statement on the holder's own row.

var (
	_ driver.Kinder        = (*Driver)(nil)
	_ driver.Withdrawer    = (*Driver)(nil)
	_ driver.MultiAcquirer = (*Driver)(nil)
	_ driver.FenceRaiser   = (*Driver)(nil)
)

// nowUS is SQLite's clock in microseconds (whole milliseconds) since the
// Unix epoch, the unit of the kinds' tables.
const nowUS = `(` + nowMS + ` * 1000)`

// SupportsKind implements driver.Kinder: every kind is supported.
func (d *Driver) SupportsKind(driver.Kind) bool { return true }

// kindKey is the signal key of a holder of a kind (see signal.grantKey).
func kindKey(name string, k driver.Kind, owner string) string {
	return name + "\x00" + strconv.Itoa(int(k)) + "\x00" + owner
}

// kindTx is one acquire transaction (sqlcommon.KindTx).
type kindTx struct {
	d  *Driver
	tx *sql.Tx
}

func (k *kindTx) Read(ctx context.Context, name string, grp int) (sqlcommon.KindState, []sqlcommon.Holder, error) {
	var st sqlcommon.KindState
	tx, err := k.d.db.BeginTx(ctx, nil)
	if err != nil {
		return st, nil, err
	}
	k.tx = tx
	// A write first: a deferred transaction takes the write lock here,
	// before it has read anything.
	if err := tx.QueryRowContext(ctx, `INSERT INTO `+k.d.kinds+` (name, grp) VALUES (?1, ?2)
ON CONFLICT (name, grp) DO UPDATE SET fence = fence
RETURNING fence, permits, `+nowUS, name, grp).Scan(&st.Fence, &st.Permits, &st.Now); err != nil {
		return st, nil, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT owner, kind, count, fence, lock_until, delay_until FROM `+k.d.holders+` WHERE name = ?1 AND grp = ?2`, name, grp)
	if err != nil {
		return st, nil, err
	}
	defer rows.Close()
	var hs []sqlcommon.Holder
	for rows.Next() {
		var h sqlcommon.Holder
		if err := rows.Scan(&h.Owner, &h.Kind, &h.Count, &h.Fence, &h.LockUntil, &h.DelayUntil); err != nil {
			return st, nil, err
		}
		hs = append(hs, h)
	}
	return st, hs, rows.Err()
}

func (k *kindTx) Write(ctx context.Context, name string, grp int, p sqlcommon.KindPlan) error {
	err := func() error {
		if p.SetState {
			if _, err := k.tx.ExecContext(ctx, `UPDATE `+k.d.kinds+` SET fence = ?3, permits = ?4 WHERE name = ?1 AND grp = ?2`, name, grp, p.Fence, p.Permits); err != nil {
				return err
			}
		}
		for _, h := range p.Delete {
			if _, err := k.tx.ExecContext(ctx, `DELETE FROM `+k.d.holders+` WHERE name = ?1 AND grp = ?2 AND owner = ?3 AND kind = ?4`, name, grp, h.Owner, h.Kind); err != nil {
				return err
			}
		}
		if h := p.Put; h != nil {
			if _, err := k.tx.ExecContext(ctx, `INSERT INTO `+k.d.holders+` (name, grp, owner, kind, count, fence, lock_until, delay_until)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (name, grp, owner, kind) DO UPDATE SET count = excluded.count, fence = excluded.fence,
	lock_until = excluded.lock_until, delay_until = excluded.delay_until`,
				name, grp, h.Owner, h.Kind, h.Count, h.Fence, h.LockUntil, h.DelayUntil); err != nil {
				return err
			}
		}
		return k.tx.Commit()
	}()
	if err != nil {
		k.Abort()
	}
	return err
}

func (k *kindTx) Abort() {
	if k.tx != nil {
		_ = k.tx.Rollback()
	}
}

// acquireKind is TryAcquire of a Read, Write or Permit request.
func (d *Driver) acquireKind(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	var g driver.Grant
	err := d.retryBusy(ctx, func() error {
		var err error
		g, err = sqlcommon.AcquireKind(ctx, "sqlitelock", &kindTx{d: d}, req)
		return err
	})
	if err != nil {
		if d.closed.Load() {
			return driver.Grant{}, fmt.Errorf("%w: %w", errClosed, err)
		}
		return driver.Grant{}, err
	}
	g.Key = sqlcommon.GrantKey(d.name(), req)
	if g.Count == 1 {
		d.sig.grantKey(kindKey(req.Name, req.Kind, req.Owner), req.Name, req.Owner)
		if req.Kind == driver.Read && d.sig != nil {
			// Other readers waiting here may share it: a release woke
			// only the longest waiter.
			d.sig.watches.WakeAll(req.Name)
		}
	}
	return g, nil
}

// releaseKind is Release of a Read, Write or Permit lease: the last hold
// deletes the holder's row (its place is free at once, no lock-delay),
// an earlier one counts down.
func (d *Driver) releaseKind(ctx context.Context, l driver.Lease) (int, error) {
	grp, kind := sqlcommon.Group(l.Kind), sqlcommon.HolderKind(l.Kind)
	key := kindKey(l.Name, l.Kind, l.Owner)
	var count int
	err := d.retryBusy(ctx, func() error {
		res, err := d.db.ExecContext(ctx, `DELETE FROM `+d.holders+`
WHERE name = ?1 AND grp = ?2 AND owner = ?3 AND kind = ?4 AND (?5 = 0 OR fence = ?5) AND count <= 1 AND `+nowUS+` < lock_until`,
			l.Name, grp, l.Owner, kind, int64(l.Token))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			count = 0
			return err
		}
		return d.db.QueryRowContext(ctx, `UPDATE `+d.holders+` SET count = count - 1
WHERE name = ?1 AND grp = ?2 AND owner = ?3 AND kind = ?4 AND (?5 = 0 OR fence = ?5) AND count > 1 AND `+nowUS+` < lock_until
RETURNING count`, l.Name, grp, l.Owner, kind, int64(l.Token)).Scan(&count)
	})
	if errors.Is(err, sql.ErrNoRows) {
		d.sig.releasedKey(key, l.Name, l.Owner)
		return 0, fmt.Errorf("sqlitelock: release %s %q: %w", l.Kind, l.Name, driver.ErrNotHeld)
	}
	if err != nil {
		return 0, d.wrap(ctx, "release", err)
	}
	if count == 0 {
		d.sig.releasedKey(key, l.Name, l.Owner)
	}
	return count, nil
}

// renewKinds extends the kinds' leases ls[i] for i in idx, in tx (or on
// the pool when tx is nil), and records those renewed.
func (d *Driver) renewKinds(ctx context.Context, tx *sql.Tx, ls []driver.Lease, idx []int, renewed map[int]bool) error {
	exec := d.db.ExecContext
	if tx != nil {
		exec = tx.ExecContext
	}
	for _, i := range idx {
		l := ls[i]
		ttl := sqlcommon.Micros(max(l.TTL, time.Millisecond))
		res, err := exec(ctx, `UPDATE `+d.holders+` SET lock_until = `+nowUS+` + ?6, delay_until = `+nowUS+` + ?6 + ?7
WHERE name = ?1 AND grp = ?2 AND owner = ?3 AND kind = ?4 AND fence = ?5 AND `+nowUS+` < lock_until`,
			l.Name, sqlcommon.Group(l.Kind), l.Owner, sqlcommon.HolderKind(l.Kind), int64(l.Token), ttl, sqlcommon.Micros(l.LockDelay))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		renewed[i] = n == 1
	}
	return nil
}

// Withdraw implements driver.Withdrawer: it deletes the mark req.Owner
// left as a waiting writer of req.Name's read/write lock, if any, and
// wakes this driver's waiters of the name (readers in other processes
// were told the mark's time left as their retry hint).
func (d *Driver) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	if d.closed.Load() {
		return errClosed
	}
	err := d.retryBusy(ctx, func() error {
		_, err := d.db.ExecContext(ctx, `DELETE FROM `+d.holders+` WHERE name = ?1 AND grp = ?2 AND owner = ?3 AND kind = ?4`,
			req.Name, sqlcommon.GroupRW, req.Owner, sqlcommon.KindMark)
		return err
	})
	if err != nil {
		return d.wrap(ctx, "withdraw", err)
	}
	if d.sig != nil {
		// Readers the mark held back in this process may go in now.
		d.sig.watches.WakeAll(req.Name)
	}
	return nil
}

// RaiseFence implements driver.FenceRaiser. For a mutex whose lease is
// live, the holder's token stays as it is (its renewals and release match
// it) and the raise is kept in the row's fence_floor, which the next new
// grant takes into account; otherwise the counter itself is raised. For a
// read/write lock or a semaphore the counter in its _kinds row is raised
// (each holder keeps its token in its own row).
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if d.closed.Load() {
		return errClosed
	}
	if atLeast > math.MaxInt64 {
		return fmt.Errorf("sqlitelock: raise fence of %q to %d: above the largest token (2^63-1): %w", name, atLeast, driver.ErrInvalid)
	}
	var q string
	var args []any
	switch k {
	case driver.Exclusive:
		q = `INSERT INTO ` + d.table + ` (name, owner, count, fence, updated_at, lock_until, delay_until, fence_floor)
VALUES (?1, '', 0, ?2, ` + nowMS + `, ` + nowMS + `, ` + nowMS + `, 0)
ON CONFLICT (name) DO UPDATE SET
	fence = CASE WHEN count > 0 AND excluded.updated_at < lock_until THEN fence ELSE max(fence, excluded.fence) END,
	fence_floor = CASE WHEN count > 0 AND excluded.updated_at < lock_until THEN max(fence_floor, excluded.fence) ELSE fence_floor END`
		args = []any{name, int64(atLeast)}
	case driver.Read, driver.Write, driver.Permit:
		q = `INSERT INTO ` + d.kinds + ` (name, grp, fence) VALUES (?1, ?2, ?3)
ON CONFLICT (name, grp) DO UPDATE SET fence = max(fence, excluded.fence)`
		args = []any{name, sqlcommon.Group(k), int64(atLeast)}
	default:
		return fmt.Errorf("sqlitelock: raise fence: %v: %w", k, driver.ErrUnsupported)
	}
	err := d.retryBusy(ctx, func() error { _, err := d.db.ExecContext(ctx, q, args...); return err })
	if err != nil {
		return d.wrap(ctx, "raise fence", err)
	}
	return nil
}

// TryAcquireMulti implements driver.MultiAcquirer: one transaction runs
// each name's grant statement (the one TryAcquire runs) in order and
// commits only if every one granted; at the first refusal it rolls back,
// leaving nothing taken, and returns that name's *driver.LockedError.
func (d *Driver) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	for _, r := range reqs {
		if r.Kind != driver.Exclusive {
			return nil, fmt.Errorf("sqlitelock: acquire several: %v is not a mutex: %w", r.Kind, driver.ErrUnsupported)
		}
	}
	gs := make([]driver.Grant, len(reqs))
	busy := -1
	err := d.retryBusy(ctx, func() error {
		busy = -1
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		st := tx.StmtContext(ctx, d.acquire)
		defer st.Close()
		for i, r := range reqs {
			ttl := max(ms(r.TTL), 1)
			var fence int64
			var count int
			err := st.QueryRowContext(ctx, r.Name, r.Owner, ttl, ms(r.LockDelay)).Scan(&fence, &count)
			if errors.Is(err, sql.ErrNoRows) {
				busy = i
				return tx.Rollback()
			}
			if err != nil {
				_ = tx.Rollback()
				return err
			}
			gs[i] = driver.Grant{Token: uint64(fence), Count: count, TTL: time.Duration(ttl) * time.Millisecond}
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, d.wrap(ctx, "acquire several", err)
	}
	if busy >= 0 {
		le := &driver.LockedError{}
		var fence, left int64
		var count int
		if d.retryBusy(ctx, func() error {
			return d.info.QueryRowContext(ctx, reqs[busy].Name).Scan(&fence, &count, &left)
		}) == nil {
			le.Token = uint64(fence)
			le.RetryAfter = time.Duration(max(left, 0)) * time.Millisecond
		}
		return nil, le
	}
	for i, r := range reqs {
		if gs[i].Count == 1 {
			d.sig.grant(r.Name, r.Owner)
		}
	}
	return sqlcommon.SetKeys(d.name(), reqs, gs), nil
}

// inspectKinds lists the kinds' locks whose names start with prefix.
func (d *Driver) inspectKinds(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	var ks []sqlcommon.KindRow
	var hs []sqlcommon.HolderRow
	err := d.retryBusy(ctx, func() error {
		ks, hs = ks[:0], hs[:0]
		rows, err := d.db.QueryContext(ctx, `SELECT name, grp, fence, permits, `+nowUS+` FROM `+d.kinds+`
WHERE substr(name, 1, length(?1)) = ?1`, prefix)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k sqlcommon.KindRow
			if err := rows.Scan(&k.Name, &k.Grp, &k.Fence, &k.Permits, &k.Now); err != nil {
				rows.Close()
				return err
			}
			ks = append(ks, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = d.db.QueryContext(ctx, `SELECT name, grp, owner, kind, count, fence, lock_until, delay_until FROM `+d.holders+`
WHERE substr(name, 1, length(?1)) = ?1`, prefix)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var h sqlcommon.HolderRow
			if err := rows.Scan(&h.Name, &h.Grp, &h.Owner, &h.Kind, &h.Count, &h.Fence, &h.LockUntil, &h.DelayUntil); err != nil {
				return err
			}
			hs = append(hs, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return sqlcommon.KindInfos(ks, hs), nil
}
