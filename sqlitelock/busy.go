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

// busyStep is the busy timeout Open gives SQLite itself: a statement that
// finds the file's write lock taken sleeps that long in SQLite's busy
// handler and then fails with SQLITE_BUSY back to retryBusy, which tries
// again at once, up to the driver's busy timeout. SQLite's own handler,
// given the whole busy timeout, sleeps 1, 2, 5, 10 ... up to 100 ms
// between tries: a process that commits back to back (a hot lock: a
// release, then the next acquire) keeps the write lock nearly all the
// time, and a waiter in another process sleeping that long almost never
// found it free (in the peer harness, with 8 drivers on one file, the
// releaser took the lock again 69–98% of the time). Tried every
// millisecond, and marking its name meanwhile (see retryBusyMarking), the
// waiter gets in while the releaser stands back.
const busyStep = time.Millisecond

// retryBusy runs fn, and runs it again while it fails with SQLITE_BUSY, for
// up to the busy timeout. A connection opened by Open waits busyStep inside
// SQLite (busy_timeout pragma) before it reports SQLITE_BUSY, and is
// retried at once; a *sql.DB the user gave to New is retried after a wait
// that doubles from 1 ms to 50 ms, since its own busy timeout is unknown.
//
// Each run of fn is one pass through the driver's gate (see Quiesce): it
// waits while the driver is quiesced, and a Quiesce waits for it to end.
// fn must not call retryBusy itself, and must not leave a transaction or
// a result set open when it returns.
func (d *Driver) retryBusy(ctx context.Context, fn func() error) error {
	return d.retryBusyMarking(ctx, "", fn)
}

// retryBusyMarking is retryBusy for an attempt of a waiting Lock on name
// (name "": none). From its first SQLITE_BUSY until it returns, the name is
// marked as watched (signal.marked), as a subscriber's is: the attempt is a
// waiter the table has not refused yet only because another driver's
// statements keep the file busy, and a driver that releases name while it
// is marked stands back (signal.yielding), which leaves the file free for
// it.
func (d *Driver) retryBusyMarking(ctx context.Context, name string, fn func() error) error {
	deadline := time.Now().Add(d.busy)
	wait := time.Millisecond
	var unmark func()
	defer func() {
		if unmark != nil {
			unmark()
		}
	}()
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
		if name != "" && unmark == nil && d.sig != nil {
			unmark = d.sig.marked(name)
		}
		if d.ownDB {
			continue // SQLite has waited busyStep
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
