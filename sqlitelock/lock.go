package sqlitelock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
	"github.com/dlock/dlock/internal/standback"
)

// standBack delays an attempt by left, the rest of the driver's stand-back
// from its name (see signal.yielding), or until ctx ends.
func (d *Driver) standBack(ctx context.Context, left time.Duration) error {
	if d.testHookStandBack != nil {
		d.testHookStandBack()
	}
	return standback.Delay(ctx, left, nil)
}

// TryAcquire makes one attempt to take or re-enter req.Name in a single
// statement. Right after this driver released the name to waiters
// elsewhere the attempt is delayed up to 5ms first (see signal.yielding).
// When another owner holds the lock (or it is within its lock-delay) it
// returns a *driver.LockedError whose RetryAfter is the time
// until the lease plus lock-delay ends by SQLite's clock.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if d.closed.Load() {
		return driver.Grant{}, errClosed
	}
	if req.Kind != driver.Exclusive {
		return d.acquireKind(ctx, req)
	}
	if left := d.sig.yielding(req.Name); left > 0 && !d.stand.Exempt(req) {
		if err := d.standBack(ctx, left); err != nil {
			return driver.Grant{}, d.wrap(ctx, "acquire", err)
		}
	}
	ttl, delay := ms(req.TTL), ms(req.LockDelay)
	if ttl < 1 {
		ttl = 1
	}
	var fence int64
	var count int
	marking := ""
	if req.Waiting {
		marking = req.Name
	}
	err := d.retryBusyMarking(ctx, marking, func() error {
		return d.acquire.QueryRowContext(ctx, req.Name, req.Owner, ttl, delay).Scan(&fence, &count)
	})
	if err == nil {
		if count == 1 {
			d.sig.grant(req.Name, req.Owner)
			d.stand.Granted(req, uint64(fence))
		}
		return driver.Grant{Token: uint64(fence), Count: count, TTL: time.Duration(ttl) * time.Millisecond, Key: sqlcommon.GrantKey(d.name(), req)}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return driver.Grant{}, d.wrap(ctx, "acquire", err)
	}
	// Held by someone else. Read the holder's token and remaining time for
	// the retry hint; this is a second statement, so the row may have
	// changed since: the hint is then merely stale, never unsafe.
	var left int64
	err = d.retryBusy(ctx, func() error {
		return d.info.QueryRowContext(ctx, req.Name).Scan(&fence, &count, &left)
	})
	d.stand.Refused(req)
	le := &driver.LockedError{}
	if err == nil {
		le.Token = uint64(fence)
		if count > 0 || left > 0 {
			le.RetryAfter = time.Duration(max(left, 0)) * time.Millisecond
		}
	}
	return driver.Grant{}, le
}

// Release gives up one hold of l.Name by l.Owner under l.Token. When the
// count reaches zero the lock is free at once (no lock-delay). When the row
// no longer carries this owner and token, or the lease has expired by
// SQLite's clock, it changes nothing and returns an error wrapping
// driver.ErrNotHeld: an expired lease ended without a release, so its
// lock-delay runs in full, and the caller learns that its lease lapsed. A
// zero l.Token (the dlock package cleaning up after a TryAcquire whose
// outcome is unknown) matches whatever l.Owner holds.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if d.closed.Load() {
		return 0, errClosed
	}
	if l.Kind != driver.Exclusive {
		return d.releaseKind(ctx, l)
	}
	var count int
	err := d.retryBusy(ctx, func() error {
		res, err := d.releaseLast.ExecContext(ctx, l.Name, l.Owner, int64(l.Token))
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 1 {
			count = 0
			return nil
		}
		// Re-entered (count > 1), or not held: one more statement says
		// which, atomically on its own.
		return d.release.QueryRowContext(ctx, l.Name, l.Owner, int64(l.Token)).Scan(&count)
	})
	if errors.Is(err, sql.ErrNoRows) {
		d.sig.released(l.Name, l.Owner)
		return 0, fmt.Errorf("sqlitelock: release %q: %w", l.Name, driver.ErrNotHeld)
	}
	if err != nil {
		return 0, d.wrap(ctx, "release", err)
	}
	if count == 0 {
		d.sig.released(l.Name, l.Owner)
	}
	return count, nil
}
