// Package sqlcommon holds what pglock and mysqllock share: the driver frame
// (Base: closed state, the lock table created once, the calls handed to the
// Locker a driver's New chose for its mode), the bookkeeping of
// session-bound locks (Sessions) over a driver's own pinned-connection type
// and SQL, table-name and option validation, the bounded wait for a pool
// connection, and the error shapes a session-bound grant reports when its
// connection dies. URL secrets and bad-URL errors are internal/openurl's.
package sqlcommon

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/dlock/dlock/driver"
)

// DefaultTable is the lock table's name when Options.Table is empty.
const DefaultTable = "dlock_locks"

// MaxTableLen leaves room for the suffixes the drivers append to the table
// name (for example "_rowlock", "_release") within PostgreSQL's 63-byte
// identifier limit.
const MaxTableLen = 48

// CheckTable reports whether name is usable as an unquoted table name on both
// databases: an ASCII letter or underscore, then letters, digits or
// underscores, at most MaxTableLen bytes. Nothing else is ever spliced into
// SQL text.
func CheckTable(name string) error {
	if name == "" {
		return errors.New("table name is empty")
	}
	if len(name) > MaxTableLen {
		return fmt.Errorf("table name %q is longer than %d bytes", name, MaxTableLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return fmt.Errorf("table name %q must match [A-Za-z_][A-Za-z0-9_]*", name)
		}
	}
	return nil
}

// SessionLost returns the error a session-bound grant reports once its pinned
// connection is gone: it wraps both driver.ErrSessionLost and
// driver.ErrNotHeld, and cause when there is one.
func SessionLost(cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: pinned connection closed: %w", driver.ErrSessionLost, driver.ErrNotHeld)
	}
	return fmt.Errorf("%w: pinned connection failed (%v): %w", driver.ErrSessionLost, cause, driver.ErrNotHeld)
}

// ErrKilled is returned by every call on a driver after the test harness has
// simulated its process's crash.
var ErrKilled = errors.New("driver was killed (simulated crash)")

// Micros converts d to whole microseconds, rounding up so that a positive
// duration never becomes zero.
func Micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Unsupported reports a LockDelay request to a session-bound mode.
func Unsupported(mode string) error {
	return fmt.Errorf("%w: lock-delay in mode %s (a session lock ends with its connection)", driver.ErrUnsupported, mode)
}

// PoolWait is how long a session mode waits for a pool connection, to pin
// or to increment a fence on: with every connection pinned by held locks a
// longer wait would be for a release that may never come, and TryAcquire
// must not hang.
const PoolWait = 3 * time.Second

// PoolError describes err, the failure to get a connection from a pool for
// what ("pinning a connection", …) within PoolWait. Only when the wait ran
// out (timedOut) while every connection the pool may open was in use
// (inUse >= size > 0) does it say the pool was exhausted; any other cause
// (a refused connection, a failed handshake, a hung dial) is reported as
// itself. err is always wrapped, so the cause stays in the chain.
func PoolError(what string, err error, timedOut bool, inUse, size int, hint string) error {
	if timedOut && size > 0 && inUse >= size {
		return fmt.Errorf("%s: no free connection within %v: all %d in use (%s): %w", what, PoolWait, size, hint, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// WithPoolWait runs get, which takes a connection from a pool (or runs a
// statement on one) for what, bounded by PoolWait, and describes its
// failure with PoolError: stats reports the pool's connections in use and
// its size, hint how to size it. It is how every wait for a pool
// connection in pglock and mysqllock is bounded.
func WithPoolWait[T any](ctx context.Context, what, hint string, stats func() (inUse, size int), get func(context.Context) (T, error)) (T, error) {
	pctx, cancel := context.WithTimeout(ctx, PoolWait)
	defer cancel()
	v, err := get(pctx)
	if err != nil {
		// Examined before cancel, which would make pctx.Err() non-nil
		// whatever happened.
		timedOut := ctx.Err() == nil && errors.Is(pctx.Err(), context.DeadlineExceeded)
		inUse, size := stats()
		var zero T
		return zero, PoolError(what, err, timedOut, inUse, size, hint)
	}
	return v, nil
}

// TakeParams removes the parameters mode and table, which the SQL drivers
// read themselves, from q and returns them; the rest of q goes to the
// database's client library. A parameter given but empty is an error.
func TakeParams(prefix string, q url.Values) (mode, table string, err error) {
	for _, p := range []string{"mode", "table"} {
		if q.Has(p) && q.Get(p) == "" {
			return "", "", fmt.Errorf("%s: URL parameter %s is empty", prefix, p)
		}
	}
	mode, table = q.Get("mode"), q.Get("table")
	q.Del("mode")
	q.Del("table")
	return mode, table, nil
}
