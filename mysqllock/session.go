package mysqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// hold is one lock held in a session mode: the pinned connection and the
// local re-entrance count (the server is asked once per hold, so GET_LOCK's
// own re-entrance never comes into play). It is the Handle of every grant on
// it.
type hold struct {
	name  string
	owner string
	token uint64
	lost  *sqlcommon.Lost

	mu    sync.Mutex // serialises use of conn
	conn  *sql.Conn
	count int
}

// pinTimeout bounds the wait for a free connection to pin: TryAcquire must
// not hang when held locks pin every connection the *sql.DB may open.
const pinTimeout = 3 * time.Second

// waitTimeout is the wait_timeout armed on a pinned session: the TTL in
// whole seconds, rounded up.
func waitTimeout(ttl time.Duration) string {
	return strconv.FormatInt(int64(max((ttl+time.Second-1)/time.Second, 1)), 10)
}

func (d *Driver) sessionAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d.mu.Lock()
	h := d.holds[req.Name]
	d.mu.Unlock()
	if h != nil {
		h.mu.Lock()
		if h.conn != nil {
			if h.owner != req.Owner {
				tok := h.token
				h.mu.Unlock()
				return driver.Grant{}, &driver.LockedError{Token: tok}
			}
			h.count++
			g := h.grant(req.TTL)
			h.mu.Unlock()
			return g, nil
		}
		h.mu.Unlock()
		d.dropHold(h) // lost or released meanwhile: acquire afresh
	}

	pctx, cancel := context.WithTimeout(ctx, pinTimeout)
	conn, err := d.db.Conn(pctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && pctx.Err() != nil {
			return driver.Grant{}, fmt.Errorf("mysqllock: acquire: no free connection within %v (every held lock pins one; see sql.DB.SetMaxOpenConns)", pinTimeout)
		}
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: pinning a connection: %w", err)
	}
	h = &hold{name: req.Name, owner: req.Owner, conn: conn, count: 1, lost: sqlcommon.NewLost()}
	var ok bool
	if d.mode == ModeGetLock {
		ok, err = d.getLock(ctx, h, req.TTL)
	} else {
		ok, err = d.rowLock(ctx, h, req.TTL)
	}
	if err != nil {
		d.abortPin(conn)
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: %w", err)
	}
	if !ok {
		_ = conn.Close()
		return driver.Grant{}, &driver.LockedError{}
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		h.destroy(errors.New("mysqllock: driver closed"))
		return driver.Grant{}, errors.New("mysqllock: driver is closed")
	}
	// A hold still listed under this name is finished on the server (the
	// server just granted the lock to this connection): it is mid-release
	// or lost, and its own goroutine removes nothing but itself. Replacing
	// it here, without touching its lock, keeps the lock order h.mu → d.mu.
	d.holds[req.Name] = h
	d.mu.Unlock()
	return h.grant(req.TTL), nil
}

// abortPin undoes a failed acquire on a pinned connection. The lock may
// have been taken before the failure, so it is given up explicitly (which
// frees it at once) and the session restored before the connection goes
// back to the pool; if that fails too, the connection is closed, which
// frees the lock once the server notices.
func (d *Driver) abortPin(conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	q := "SET autocommit = 1, SESSION wait_timeout = DEFAULT" // ends the transaction
	if d.mode == ModeGetLock {
		q = "SET SESSION wait_timeout = DEFAULT, @dlock_released = RELEASE_ALL_LOCKS()"
	}
	if _, err := conn.ExecContext(ctx, q); err != nil {
		discard(conn)
		return
	}
	_ = conn.Close()
}

func (h *hold) grant(ttl time.Duration) driver.Grant {
	return driver.Grant{Token: h.token, Count: h.count, TTL: ttl, Handle: h, Lost: h.lost.C(), Cause: h.lost.Cause}
}

// getLock takes GET_LOCK(name, 0), arming wait_timeout in the same
// statement, then bumps the fence in an autocommitted statement gated on the
// grant. On refusal the session is left as it was.
func (d *Driver) getLock(ctx context.Context, h *hold, ttl time.Duration) (bool, error) {
	if _, err := h.conn.ExecContext(ctx, fill(d.q.getLock, "{L}", hexLit(LockName(h.name)), "{WT}", waitTimeout(ttl))); err != nil {
		return false, err
	}
	res, err := h.conn.ExecContext(ctx, fill(d.q.fenceInsert, "{K}", hexLit(h.name), "{O}", hexLit(h.owner), "{L}", hexLit(LockName(h.name))))
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err // not granted: nothing inserted or updated
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, err
	}
	h.token = uint64(id)
	return true, nil
}

// rowLock turns autocommit off and arms wait_timeout, then locks the name's
// row with FOR UPDATE NOWAIT; the transaction that read opened stays open
// until release. The fencing counter is bumped on another pooled connection
// in autocommit: an increment inside the held transaction would be rolled
// back if the holder crashed, and the next holder would be handed the same
// token again.
func (d *Driver) rowLock(ctx context.Context, h *hold, ttl time.Duration) (bool, error) {
	if _, err := h.conn.ExecContext(ctx, "SET autocommit = 0, SESSION wait_timeout = "+waitTimeout(ttl)); err != nil {
		return false, err
	}
	k := hexLit(h.name)
	for attempt := 0; ; attempt++ {
		var one int
		err := h.conn.QueryRowContext(ctx, fill(d.q.rowLock, "{K}", k)).Scan(&one)
		switch {
		case err == nil:
		case errors.Is(err, sql.ErrNoRows) && attempt == 0:
			// First use of the name: end this transaction (its locking
			// read may hold a gap lock) and create the row in autocommit.
			if _, err := h.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				return false, err
			}
			ectx, cancel := context.WithTimeout(ctx, pinTimeout)
			_, err := d.db.ExecContext(ectx, fill(d.q.rowEnsure, "{K}", k))
			cancel()
			if err != nil {
				return false, err
			}
			continue
		case isLockNotAvailable(err):
			_, rerr := h.conn.ExecContext(ctx, d.q.rowRelease)
			return false, rerr
		default:
			return false, err
		}
		// Bounded: with every connection pinned by held locks this would
		// otherwise wait for a release that may never come.
		fctx, cancel := context.WithTimeout(ctx, pinTimeout)
		res, err := d.db.ExecContext(fctx, fill(d.q.fenceBump, "{K}", k, "{O}", hexLit(h.owner)))
		cancel()
		if err != nil {
			return false, fmt.Errorf("bumping the fencing counter on a second connection (the pool needs one more than the locks held): %w", err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			return false, err
		}
		h.token = uint64(id)
		return true, nil
	}
}

func (d *Driver) lookup(l driver.Lease) (*hold, error) {
	h, _ := l.Handle.(*hold)
	if h == nil || h.name != l.Name || h.owner != l.Owner || h.token != l.Token {
		return nil, fmt.Errorf("mysqllock: lease was not granted by this driver: %w", driver.ErrNotHeld)
	}
	return h, nil
}

func (d *Driver) sessionRelease(ctx context.Context, l driver.Lease) (int, error) {
	h, err := d.lookup(l)
	if err != nil {
		return 0, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		if c := h.lost.Cause(); c != nil {
			return 0, fmt.Errorf("mysqllock: release: %w", c)
		}
		return 0, fmt.Errorf("mysqllock: release: %w", driver.ErrNotHeld)
	}
	if h.count > 1 {
		h.count--
		return h.count, nil
	}
	if d.mode == ModeGetLock {
		_, err = h.conn.ExecContext(ctx, fill(d.q.getLockRelease, "{L}", hexLit(LockName(h.name))))
	} else {
		_, err = h.conn.ExecContext(ctx, d.q.rowRelease)
	}
	d.dropHold(h)
	conn := h.conn
	h.conn = nil
	h.count = 0
	if err != nil {
		// The session's state is unknown: close the connection, which
		// ends the session and with it any lock it still had.
		discard(conn)
		cause := sqlcommon.SessionLost(err)
		h.lost.Close(cause)
		return 0, fmt.Errorf("mysqllock: release: %w", cause)
	}
	_ = conn.Close()
	return 0, nil
}

func (d *Driver) dropHold(h *hold) {
	d.mu.Lock()
	if d.holds[h.name] == h {
		delete(d.holds, h.name)
	}
	d.mu.Unlock()
}

// discard closes c's underlying connection instead of returning it to the
// pool.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return sqldriver.ErrBadConn })
	_ = c.Close()
}

// destroy closes h's connection (ending its session and its lock) and
// signals loss with cause.
func (h *hold) destroy(cause error) {
	h.mu.Lock()
	if h.conn != nil {
		discard(h.conn)
		h.conn = nil
	}
	h.mu.Unlock()
	h.lost.Close(cause)
}

func (d *Driver) sessionRenew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	errs := make([]error, len(ls))
	type job struct {
		h   *hold
		ttl time.Duration
		idx []int
	}
	jobs := map[*hold]*job{}
	var order []*job
	for i, l := range ls {
		h, err := d.lookup(l)
		if err != nil {
			errs[i] = err
			continue
		}
		j := jobs[h]
		if j == nil {
			j = &job{h: h}
			jobs[h] = j
			order = append(order, j)
		}
		j.ttl = max(j.ttl, l.TTL)
		j.idx = append(j.idx, i)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, j := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := d.ping(ctx, j.h, j.ttl)
			for _, i := range j.idx {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errs, nil
}

// ping proves h's connection is alive and re-arms its wait_timeout. A failed
// ping ends the hold: the connection is closed, so whatever lock it had is
// gone on the server too.
func (d *Driver) ping(ctx context.Context, h *hold, ttl time.Duration) error {
	h.mu.Lock()
	if h.conn == nil {
		h.mu.Unlock()
		if c := h.lost.Cause(); c != nil {
			return c
		}
		return fmt.Errorf("mysqllock: renew: %w", driver.ErrNotHeld)
	}
	_, err := h.conn.ExecContext(ctx, fill(d.q.ping, "{WT}", waitTimeout(ttl)))
	h.mu.Unlock()
	if err != nil {
		cause := sqlcommon.SessionLost(err)
		d.dropHold(h)
		h.destroy(cause)
		return fmt.Errorf("mysqllock: renew: %w", cause)
	}
	return nil
}

// holderConnID returns the server connection id holding name in this
// driver, for tests that KILL it from outside.
func (d *Driver) holderConnID(ctx context.Context, name string) (int64, bool) {
	d.mu.Lock()
	h := d.holds[name]
	d.mu.Unlock()
	if h == nil {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return 0, false
	}
	var id int64
	if err := h.conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return 0, false
	}
	return id, true
}
