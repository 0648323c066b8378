package sqlitelock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock/internal/ctxerr"
)

// wrap adds context to a failed statement. When ctx is done the error wraps
// ctx.Err() as well, whatever SQLite reported (an interrupt).
func (d *Driver) wrap(ctx context.Context, op string, err error) error {
	if d.closed.Load() {
		return fmt.Errorf("%w: %s: %w", errClosed, op, err)
	}
	return ctxerr.Wrap(ctx, "sqlitelock: "+op, err)
}

// isBusy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED: the
// statement did not run because another connection held a lock.
func isBusy(err error) bool {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		switch coded.Code() & 0xff {
		case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
			return true
		}
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "SQLITE_BUSY")
}

// retryBusy runs fn, and runs it again while it fails with SQLITE_BUSY, for
// up to the busy timeout. A connection opened by Open waits inside SQLite
// already (busy_timeout pragma), so this matters for a *sql.DB the user gave
// to New without one.
//
// Each run of fn is one pass through the driver's gate (see Quiesce): it
// waits while the driver is quiesced, and a Quiesce waits for it to end.
// fn must not call retryBusy itself, and must not leave a transaction or
// a result set open when it returns.
func (d *Driver) retryBusy(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(d.busy)
	wait := time.Millisecond
	for {
		if err := d.gate.enter(ctx); err != nil {
			return err
		}
		err := fn()
		d.gate.leave()
		if err == nil || !isBusy(err) || ctx.Err() != nil {
			return err
		}
		if time.Until(deadline) <= 0 {
			return err
		}
		t := time.NewTimer(min(wait, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}
