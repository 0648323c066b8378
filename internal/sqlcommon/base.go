package sqlcommon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Locker is one way of holding locks on a SQL database, chosen by a
// driver's New: a lease table (a row per name whose expiry the server's
// clock decides) or Sessions (a lock that lives as long as its pinned
// connection). TryAcquire, Release and Renew have the contract of the
// driver.Driver methods of the same names; Base calls them only once the
// lock table exists, and Renew never with an empty ls.
type Locker interface {
	TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error)
	Release(ctx context.Context, l driver.Lease) (remaining int, err error)
	Renew(ctx context.Context, ls []driver.Lease) (errs []error, err error)
	// Close refuses later grants and ends what the Locker holds on the
	// server (the session modes close their pinned connections). It is
	// called on every Close of the driver, also after Kill, and must be
	// idempotent.
	Close()
	// Kill simulates a crash for the test harness: later grants are
	// refused and what is held is abandoned without any traffic.
	Kill()
}

// Base is the part of driver.Driver that pglock and mysqllock share: the
// closed and killed state, the lock table created once on first use, and
// the calls handed to the Locker chosen in New. All methods are safe for
// concurrent use. The zero value is not usable; use NewBase.
type Base struct {
	prefix string
	locker Locker
	schema func(context.Context) error

	schemaMu sync.Mutex
	schemaOK bool

	mu     sync.Mutex
	closed bool
	killed bool
}

// NewBase returns the Base of the driver named prefix (for example
// "pglock"), which leads its errors. schema creates the lock table(s); it
// runs on first use and again after each failure until it succeeds once.
func NewBase(prefix string, l Locker, schema func(context.Context) error) *Base {
	return &Base{prefix: prefix, locker: l, schema: schema}
}

// Check returns ErrKilled after Kill, an error after Close, and nil before.
func (b *Base) Check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.killed:
		return ErrKilled
	case b.closed:
		return errors.New(b.prefix + ": driver is closed")
	}
	return nil
}

// Ready returns Check's error, or creates the lock table if no call has
// yet, and returns its error.
func (b *Base) Ready(ctx context.Context) error {
	if err := b.Check(); err != nil {
		return err
	}
	b.schemaMu.Lock()
	defer b.schemaMu.Unlock()
	if b.schemaOK {
		return nil
	}
	if err := b.schema(ctx); err != nil {
		return err
	}
	b.schemaOK = true
	return nil
}

// TryAcquire implements driver.Driver.
func (b *Base) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := b.Ready(ctx); err != nil {
		return driver.Grant{}, err
	}
	return b.locker.TryAcquire(ctx, req)
}

// Release implements driver.Driver.
func (b *Base) Release(ctx context.Context, l driver.Lease) (int, error) {
	if err := b.Ready(ctx); err != nil {
		return 0, err
	}
	return b.locker.Release(ctx, l)
}

// Renew implements driver.Driver.
func (b *Base) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if err := b.Ready(ctx); err != nil {
		return nil, err
	}
	if len(ls) == 0 {
		return nil, nil
	}
	return b.locker.Renew(ctx, ls)
}

// Close marks the driver closed and closes the Locker. It reports whether
// this was the first Close of a driver that was not killed: only then must
// the driver stop its own work (listeners, a pool it opened).
func (b *Base) Close() (first bool) {
	b.mu.Lock()
	first = !b.closed
	b.closed = true
	b.mu.Unlock()
	b.locker.Close()
	return first
}

// Kill marks the driver killed and closed and kills the Locker.
func (b *Base) Kill() {
	b.mu.Lock()
	b.killed, b.closed = true, true
	b.mu.Unlock()
	b.locker.Kill()
}

// Inspect implements driver.Inspector for a driver whose list reads the
// lock table's rows under prefix and whose mode's held says which of them
// are held; the listing is then finished by Settle.
func (b *Base) Inspect(ctx context.Context, prefix string, sessionBound bool,
	list func(ctx context.Context, prefix string) ([]driver.LockInfo, error),
	held func(ctx context.Context, prefix string, out []driver.LockInfo) ([]bool, error)) ([]driver.LockInfo, error) {
	if err := b.Ready(ctx); err != nil {
		return nil, err
	}
	out, err := list(ctx, prefix)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, b.prefix+": inspect", err)
	}
	h, err := held(ctx, prefix, out)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, b.prefix+": inspect", err)
	}
	return Settle(out, h, sessionBound), nil
}

// HeldUnlessFree returns, for a row-lock mode's Settle, which locks in out
// are held: those not named in free, the rows a SKIP LOCKED read returned.
func HeldUnlessFree(out []driver.LockInfo, free map[string]bool) []bool {
	held := make([]bool, len(out))
	for i, li := range out {
		held[i] = !free[li.Name]
	}
	return held
}

// Settle finishes an Inspect listing of the lock table, out, for a mode:
// held[i] says whether out[i] is held. A lock that is not held reports no
// owner, count or expiry. A held one keeps its row's values in a lease
// mode; in a session mode (sessionBound) it reports Count 1 (the
// re-entrance count lives in the holder's process) and ExpiresIn -1.
func Settle(out []driver.LockInfo, held []bool, sessionBound bool) []driver.LockInfo {
	for i := range out {
		switch {
		case !held[i]:
			out[i].Owner, out[i].Count, out[i].ExpiresIn = "", 0, 0
		case sessionBound:
			out[i].Count, out[i].ExpiresIn = 1, -1
		}
	}
	return out
}

// Unexpired is the held step of Base.Inspect for a lease mode: the locks
// in out whose lease has time left are held.
func Unexpired(_ context.Context, _ string, out []driver.LockInfo) ([]bool, error) {
	held := make([]bool, len(out))
	for i, li := range out {
		held[i] = li.ExpiresIn > 0
	}
	return held, nil
}

// Rows is what pgx.Rows and *sql.Rows have in common.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanLocks reads the rows of a lock table listing for Inspect: name,
// owner, fencing counter, hold count and the lease's time left in µs
// (negative or zero when expired). The caller closes rows.
func ScanLocks(rows Rows) ([]driver.LockInfo, error) {
	var out []driver.LockInfo
	for rows.Next() {
		li := driver.LockInfo{Waiters: -1}
		var left int64
		if err := rows.Scan(&li.Name, &li.Owner, &li.Token, &li.Count, &left); err != nil {
			return nil, err
		}
		li.ExpiresIn = time.Duration(left) * time.Microsecond
		out = append(out, li)
	}
	return out, rows.Err()
}

// Config is what a SQL driver's Options say, completed with the defaults.
type Config struct {
	Mode  string
	Table string
}

// Configure completes a driver's options: mode defaults to the first of
// modes and must be one of them, table defaults to DefaultTable and must
// pass CheckTable. Errors are led by prefix.
func Configure(prefix, mode, table string, modes ...string) (Config, error) {
	if mode == "" {
		mode = modes[0]
	}
	ok := false
	for _, m := range modes {
		ok = ok || m == mode
	}
	if !ok {
		return Config{}, fmt.Errorf("%s: unknown mode %q (want %s or %s)", prefix, mode,
			strings.Join(modes[:len(modes)-1], ", "), modes[len(modes)-1])
	}
	if table == "" {
		table = DefaultTable
	}
	if err := CheckTable(table); err != nil {
		return Config{}, fmt.Errorf("%s: %w", prefix, err)
	}
	return Config{Mode: mode, Table: table}, nil
}

// GrantKey returns the driver.Grant.Key of a grant of req in the lock
// table table: "<table>/<name>" for a mutex (its row in the lock table),
// "<table>_holders/<name>/<kind>/<owner>" for a read/write lock or a
// semaphore (its holder row; kind is "read", "write" or "permit"). The
// session modes use the same form: there it names the lock that the
// session's advisory lock, GET_LOCK or row lock holds for the name.
func GrantKey(table string, req driver.AcquireRequest) string {
	if req.Kind == driver.Exclusive {
		return table + "/" + req.Name
	}
	return table + "_holders/" + req.Name + "/" + req.Kind.String() + "/" + req.Owner
}

// KeyedRequest returns req's GrantKey and req with its Name a slice of that
// key (GrantKey holds the name whole). A driver that keeps the name for as
// long as the lock is held keeps that slice, which shares the key's bytes
// with the grant (and with the dlock Lease, which keeps the key and slices
// its name from it too), so the caller's name string, often made for the
// one Lock, is not kept alive per held lock.
func KeyedRequest(table string, req driver.AcquireRequest) (string, driver.AcquireRequest) {
	key := GrantKey(table, req)
	at := len(table) + len("/")
	if req.Kind != driver.Exclusive {
		at = len(table) + len("_holders/")
	}
	req.Name = key[at : at+len(req.Name)]
	return key, req
}

// SetKeys sets the Key of each grant in gs, the grants of reqs in order,
// with GrantKey, and returns gs.
func SetKeys(table string, reqs []driver.AcquireRequest, gs []driver.Grant) []driver.Grant {
	for i := range gs {
		if i < len(reqs) {
			gs[i].Key = GrantKey(table, reqs[i])
		}
	}
	return gs
}
