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
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
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
//
// get runs under a context that ctx cancels, and that is cancelled
// PoolWait after the call if get has not returned by then; the error of a
// get cut short that way has context.DeadlineExceeded in its chain, as when
// the bound was a context deadline. The bound is kept by one timer shared
// by every wait in the process (see poolWaits), not by a timer per call: a
// timer armed per call woke the Go netpoller (an eventfd write and a
// thread wake-up) on every uncontended acquire, where the connection is
// idle in the pool and get returns at once.
func WithPoolWait[T any](ctx context.Context, what, hint string, stats func() (inUse, size int), get func(context.Context) (T, error)) (T, error) {
	return withWait(&poolWaits, ctx, what, hint, stats, get)
}

// withWait is WithPoolWait bounded by ws.
func withWait[T any](ws *waits, ctx context.Context, what, hint string, stats func() (inUse, size int), get func(context.Context) (T, error)) (T, error) {
	pctx, w := ws.start(ctx)
	v, err := get(pctx)
	cut := ws.finish(w)
	if err != nil {
		// A wait cut short by the bound, and not ended by ctx first.
		timedOut := cut && ctx.Err() == nil
		switch {
		case cut && err == context.Canceled:
			// The call saw nothing but the cut: reported as the context
			// deadline it stands for.
			err = context.DeadlineExceeded
		case cut:
			err = fmt.Errorf("%w after %v (%w)", context.DeadlineExceeded, ws.limit, err)
		}
		inUse, size := stats()
		var zero T
		// A get that failed in its own words (a dial's i/o timeout) as
		// ctx's deadline passed reports that deadline too.
		return zero, PoolError(what, ctxerr.With(ctx, err), timedOut, inUse, size, hint)
	}
	return v, nil
}

// poolWaits bounds every WithPoolWait in the process by PoolWait.
var poolWaits = waits{limit: PoolWait}

// errWaitCut is the cause a wait cut short by its bound is cancelled with.
var errWaitCut = errors.New("sqlcommon: the wait for a pool connection ran out")

// waits bounds calls by limit each with one timer for all of them: the
// waits in progress are listed oldest first (their ends come in the same
// order, all being limit after their start), and the timer is armed for
// the oldest one's end only when it is not armed already. A wait that ends
// before the timer fires leaves it armed; when it fires it cuts the waits
// past their end and is armed again for the oldest one left, if any. A
// steady stream of short waits so arms it about once per limit instead of
// once per wait, and cuts every wait within its limit all the same.
// All methods are safe for concurrent use; the zero value with a limit set
// is ready to use.
type waits struct {
	limit time.Duration

	mu         sync.Mutex
	head, tail *wait
	timer      SharedTimer // set to fire at the end of some wait
}

// wait is one call bounded by a waits.
type wait struct {
	end        time.Time
	cancel     context.CancelCauseFunc
	prev, next *wait
	listed     bool // in the list, not yet finished or cut
	cut        bool // cancelled by the bound
}

// start lists a new wait and returns the context its call runs under.
func (ws *waits) start(ctx context.Context) (context.Context, *wait) {
	pctx, cancel := context.WithCancelCause(ctx)
	w := &wait{cancel: cancel, listed: true}
	ws.mu.Lock()
	w.end = time.Now().Add(ws.limit)
	w.prev = ws.tail
	if ws.tail != nil {
		ws.tail.next = w
	} else {
		ws.head = w
	}
	ws.tail = w
	if !ws.timer.Armed() {
		ws.timer.Arm(ws.limit, ws.fire)
	}
	ws.mu.Unlock()
	return pctx, w
}

// unlink removes w from the list; ws.mu is held.
func (ws *waits) unlink(w *wait) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		ws.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		ws.tail = w.prev
	}
	w.prev, w.next, w.listed = nil, nil, false
}

// finish ends w, releasing its context, and reports whether the bound cut
// it short.
func (ws *waits) finish(w *wait) (cut bool) {
	ws.mu.Lock()
	if w.listed {
		ws.unlink(w)
	}
	cut = w.cut
	ws.mu.Unlock()
	w.cancel(context.Canceled)
	return cut
}

// fire cuts the waits past their end and arms the timer again for the
// oldest one left.
func (ws *waits) fire() {
	var cut []*wait
	ws.mu.Lock()
	now := time.Now()
	for w := ws.head; w != nil && !w.end.After(now); w = ws.head {
		ws.unlink(w)
		w.cut = true
		cut = append(cut, w)
	}
	ws.timer.Fired()
	if ws.head != nil {
		ws.timer.Arm(ws.head.end.Sub(now), ws.fire)
	}
	ws.mu.Unlock()
	for _, w := range cut {
		w.cancel(errWaitCut)
	}
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
