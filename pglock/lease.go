package pglock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/standback"
)

// leases is the Locker of ModeLease: one row per name in the lock table,
// expiry decided by the server's now(). A release that NOTIFYs waiters
// starts a stand-back on stand.
type leases struct {
	*store
	stand *standback.StandBack
}

var _ sqlcommon.Locker = leases{}

// TryAcquire implements sqlcommon.Locker: an UPDATE … WHERE <free or ours>
// RETURNING of the name's row and, only when that updates nothing (the row
// is missing or held by another), one INSERT … ON CONFLICT … DO UPDATE …
// WHERE <free or ours> RETURNING that decides again and reports how long the
// row stays held.
func (d leases) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Kind != driver.Exclusive {
		return d.acquireKind(ctx, req)
	}
	var (
		won        bool
		fence      int64
		count      int
		retryAfter int64
	)
	// The common case in one plain UPDATE; no row means the name's row is
	// missing or not free, which the upsert below decides and reports.
	err := d.pool.QueryRow(ctx, d.q.leaseTake, req.Name, req.Owner, micros(req.TTL), micros(req.LockDelay)).Scan(&fence, &count)
	if err == nil {
		return driver.Grant{Token: uint64(fence), Count: count, TTL: req.TTL}, nil
	}
	if !isNoRows(err) {
		return driver.Grant{}, ctxerr.Wrap(ctx, "pglock: acquire", err)
	}
	err = d.pool.QueryRow(ctx, d.q.leaseAcquire, req.Name, req.Owner, micros(req.TTL), micros(req.LockDelay)).
		Scan(&won, &fence, &count, &retryAfter)
	if err != nil {
		if isNoRows(err) {
			// The row was created by a transaction that committed after
			// this statement's snapshot: it is held, for how long is unknown.
			return driver.Grant{}, &driver.LockedError{}
		}
		return driver.Grant{}, ctxerr.Wrap(ctx, "pglock: acquire", err)
	}
	if !won {
		return driver.Grant{}, &driver.LockedError{RetryAfter: time.Duration(retryAfter) * time.Microsecond, Token: uint64(fence)}
	}
	if fence == 1 {
		// The name's first grant: its row was inserted (a row's fence
		// only grows; one that another driver raised first does not
		// count here, which only delays the next ANALYZE).
		d.rowAdded(&d.grown.lock)
	}
	return driver.Grant{Token: uint64(fence), Count: count, TTL: req.TTL}, nil
}

// Release implements sqlcommon.Locker; a release to zero NOTIFYs waiters,
// if any driver marks the name as waited for, in the same statement, and
// then this driver stands back from the name for a moment (see
// standback.StandBack): it knows from the statement that someone waits.
func (d leases) Release(ctx context.Context, l driver.Lease) (int, error) {
	if l.Kind != driver.Exclusive {
		return d.releaseKind(ctx, l)
	}
	var (
		remaining int
		notified  *bool
	)
	err := d.pool.QueryRow(ctx, d.q.leaseRelease, l.Name, l.Owner, int64(l.Token), d.channel, WaitKey(l.Name)).Scan(&remaining, &notified)
	if err != nil {
		if isNoRows(err) {
			return 0, fmt.Errorf("pglock: release: %w", driver.ErrNotHeld)
		}
		return 0, ctxerr.Wrap(ctx, "pglock: release", err)
	}
	if remaining == 0 && notified != nil && *notified {
		d.stand.Released(l.Name, l.Token)
	}
	return remaining, nil
}

// Renew implements sqlcommon.Locker: one UPDATE … FROM unnest(…) for all
// of ls, or, when ls mixes mutexes and other kinds, one statement with an
// UPDATE of each table.
func (d leases) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	var mutexes, kinds []int
	for i, l := range ls {
		if l.Kind == driver.Exclusive {
			mutexes = append(mutexes, i)
		} else {
			kinds = append(kinds, i)
		}
	}
	names := make([]string, len(mutexes))
	owners := make([]string, len(mutexes))
	fences := make([]int64, len(mutexes))
	ttls := make([]int64, len(mutexes))
	delays := make([]int64, len(mutexes))
	for j, i := range mutexes {
		l := ls[i]
		names[j], owners[j], fences[j] = l.Name, l.Owner, int64(l.Token)
		ttls[j], delays[j] = micros(l.TTL), micros(l.LockDelay)
	}
	var (
		rows pgx.Rows
		err  error
	)
	switch {
	case len(kinds) == 0:
		rows, err = d.pool.Query(ctx, d.q.leaseRenew, names, owners, fences, ttls, delays)
	case len(mutexes) == 0:
		rows, err = d.pool.Query(ctx, d.q.kindRenew, renewArgs(ls, kinds)...)
	default:
		rows, err = d.pool.Query(ctx, d.q.mixedRenew, append([]any{names, owners, fences, ttls, delays}, renewArgs(ls, kinds)...)...)
	}
	if err != nil {
		return nil, ctxerr.Wrap(ctx, "pglock: renew", err)
	}
	renewed := make(map[sqlcommon.LeaseKey]bool, len(ls))
	for rows.Next() {
		var k sqlcommon.LeaseKey
		var err error
		if len(kinds) == 0 {
			err = rows.Scan(&k.Name, &k.Owner, &k.Fence)
		} else {
			err = rows.Scan(&k.Name, &k.Owner, &k.Kind, &k.Fence)
		}
		if err != nil {
			rows.Close()
			return nil, ctxerr.Wrap(ctx, "pglock: renew", err)
		}
		renewed[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, ctxerr.Wrap(ctx, "pglock: renew", err)
	}
	errs := make([]error, len(ls))
	for i, l := range ls {
		if !renewed[sqlcommon.KeyOf(l)] {
			errs[i] = fmt.Errorf("pglock: renew: lease expired or taken over: %w", driver.ErrNotHeld)
		}
	}
	return errs, nil
}

// Close implements sqlcommon.Locker: leases are left to expire.
func (leases) Close() {}

// Kill implements sqlcommon.Locker.
func (leases) Kill() {}
