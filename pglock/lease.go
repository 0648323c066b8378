package pglock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
)

func (d *Driver) leaseAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	var (
		won        bool
		fence      int64
		count      int
		retryAfter int64
	)
	err := d.pool.QueryRow(ctx, d.q.leaseAcquire, req.Name, req.Owner, micros(req.TTL), micros(req.LockDelay)).
		Scan(&won, &fence, &count, &retryAfter)
	if err != nil {
		if isNoRows(err) {
			// The row was created by a transaction that committed after
			// this statement's snapshot: it is held, for how long is unknown.
			return driver.Grant{}, &driver.LockedError{}
		}
		return driver.Grant{}, fmt.Errorf("pglock: acquire: %w", err)
	}
	if !won {
		return driver.Grant{}, &driver.LockedError{RetryAfter: time.Duration(retryAfter) * time.Microsecond, Token: uint64(fence)}
	}
	return driver.Grant{Token: uint64(fence), Count: count, TTL: req.TTL}, nil
}

func (d *Driver) leaseRelease(ctx context.Context, l driver.Lease) (int, error) {
	var (
		remaining int
		notified  *bool
	)
	err := d.pool.QueryRow(ctx, d.q.leaseRelease, l.Name, l.Owner, int64(l.Token), d.channel).Scan(&remaining, &notified)
	if err != nil {
		if isNoRows(err) {
			return 0, fmt.Errorf("pglock: release: %w", driver.ErrNotHeld)
		}
		return 0, fmt.Errorf("pglock: release: %w", err)
	}
	return remaining, nil
}

type leaseKey struct {
	name, owner string
	fence       int64
}

func (d *Driver) leaseRenew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	names := make([]string, len(ls))
	owners := make([]string, len(ls))
	fences := make([]int64, len(ls))
	ttls := make([]int64, len(ls))
	delays := make([]int64, len(ls))
	for i, l := range ls {
		names[i], owners[i], fences[i] = l.Name, l.Owner, int64(l.Token)
		ttls[i], delays[i] = micros(l.TTL), micros(l.LockDelay)
	}
	rows, err := d.pool.Query(ctx, d.q.leaseRenew, names, owners, fences, ttls, delays)
	if err != nil {
		return nil, fmt.Errorf("pglock: renew: %w", err)
	}
	renewed := make(map[leaseKey]bool, len(ls))
	for rows.Next() {
		var k leaseKey
		if err := rows.Scan(&k.name, &k.owner, &k.fence); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pglock: renew: %w", err)
		}
		renewed[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pglock: renew: %w", err)
	}
	errs := make([]error, len(ls))
	for i, l := range ls {
		if !renewed[leaseKey{l.Name, l.Owner, int64(l.Token)}] {
			errs[i] = fmt.Errorf("pglock: renew: lease expired or taken over: %w", driver.ErrNotHeld)
		}
	}
	return errs, nil
}
