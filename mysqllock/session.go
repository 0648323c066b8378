package mysqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock/dlock/driver"
)

// pinned is the connection a session-mode lock pins for as long as it is
// held. The server is asked once per hold, so GET_LOCK's own re-entrance
// never comes into play.
type pinned struct{ *sql.Conn }

// Release implements sqlcommon.Conn: it returns the connection to the pool.
func (c pinned) Release() { _ = c.Close() }

// Discard implements sqlcommon.Conn: it closes the connection, ending its
// session.
func (c pinned) Discard() { discard(c.Conn) }

// Abandon implements sqlcommon.Conn.
func (c pinned) Abandon() func() { return c.Discard }

// pinTimeout bounds the wait for a free connection to pin: TryAcquire must
// not hang when held locks pin every connection the *sql.DB may open.
const pinTimeout = 3 * time.Second

// waitTimeout is the wait_timeout armed on a pinned session: the TTL in
// whole seconds, rounded up.
func waitTimeout(ttl time.Duration) string {
	return strconv.FormatInt(int64(max((ttl+time.Second-1)/time.Second, 1)), 10)
}

func (d *Driver) sessionAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	pin := func(ctx context.Context) (pinned, error) {
		pctx, cancel := context.WithTimeout(ctx, pinTimeout)
		conn, err := d.db.Conn(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && pctx.Err() != nil {
				return pinned{}, fmt.Errorf("mysqllock: acquire: no free connection within %v (every held lock pins one; see sql.DB.SetMaxOpenConns)", pinTimeout)
			}
			return pinned{}, fmt.Errorf("mysqllock: acquire: pinning a connection: %w", err)
		}
		return pinned{conn}, nil
	}
	lock := func(ctx context.Context, c pinned) (bool, uint64, error) {
		if d.mode == ModeGetLock {
			return d.getLock(ctx, c.Conn, req.Name, req.Owner, req.TTL)
		}
		return d.rowLock(ctx, c.Conn, req.Name, req.Owner, req.TTL)
	}
	return d.sess.Acquire(ctx, req, string(d.mode), pin, lock, func(c pinned) { d.abortPin(c.Conn) })
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

// getLock takes GET_LOCK(name, 0), arming wait_timeout in the same
// statement, then bumps the fence in an autocommitted statement gated on the
// grant. On refusal the session is left as it was.
func (d *Driver) getLock(ctx context.Context, conn *sql.Conn, name, owner string, ttl time.Duration) (bool, uint64, error) {
	if _, err := conn.ExecContext(ctx, fill(d.q.getLock, "{L}", hexLit(LockName(name)), "{WT}", waitTimeout(ttl))); err != nil {
		return false, 0, err
	}
	res, err := conn.ExecContext(ctx, fill(d.q.fenceInsert, "{K}", hexLit(name), "{O}", hexLit(owner), "{L}", hexLit(LockName(name))))
	if err != nil {
		return false, 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, 0, err // not granted: nothing inserted or updated
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, 0, err
	}
	return true, uint64(id), nil
}

// rowLock turns autocommit off and arms wait_timeout, then locks the name's
// row with FOR UPDATE NOWAIT; the transaction that read opened stays open
// until release. The fencing counter is bumped on another pooled connection
// in autocommit: an increment inside the held transaction would be rolled
// back if the holder crashed, and the next holder would be handed the same
// token again.
func (d *Driver) rowLock(ctx context.Context, conn *sql.Conn, name, owner string, ttl time.Duration) (bool, uint64, error) {
	if _, err := conn.ExecContext(ctx, "SET autocommit = 0, SESSION wait_timeout = "+waitTimeout(ttl)); err != nil {
		return false, 0, err
	}
	k := hexLit(name)
	for attempt := 0; ; attempt++ {
		var one int
		err := conn.QueryRowContext(ctx, fill(d.q.rowLock, "{K}", k)).Scan(&one)
		switch {
		case err == nil:
		case errors.Is(err, sql.ErrNoRows) && attempt == 0:
			// First use of the name: end this transaction (its locking
			// read may hold a gap lock) and create the row in autocommit.
			if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				return false, 0, err
			}
			ectx, cancel := context.WithTimeout(ctx, pinTimeout)
			_, err := d.db.ExecContext(ectx, fill(d.q.rowEnsure, "{K}", k))
			cancel()
			if err != nil {
				return false, 0, err
			}
			continue
		case isLockNotAvailable(err):
			_, rerr := conn.ExecContext(ctx, d.q.rowRelease)
			return false, 0, rerr
		default:
			return false, 0, err
		}
		// Bounded: with every connection pinned by held locks this would
		// otherwise wait for a release that may never come.
		fctx, cancel := context.WithTimeout(ctx, pinTimeout)
		res, err := d.db.ExecContext(fctx, fill(d.q.fenceBump, "{K}", k, "{O}", hexLit(owner)))
		cancel()
		if err != nil {
			return false, 0, fmt.Errorf("bumping the fencing counter on a second connection (the pool needs one more than the locks held): %w", err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			return false, 0, err
		}
		return true, uint64(id), nil
	}
}

func (d *Driver) sessionRelease(ctx context.Context, l driver.Lease) (int, error) {
	return d.sess.Release(ctx, l, func(ctx context.Context, c pinned) error {
		var err error
		if d.mode == ModeGetLock {
			_, err = c.ExecContext(ctx, fill(d.q.getLockRelease, "{L}", hexLit(LockName(l.Name))))
		} else {
			_, err = c.ExecContext(ctx, d.q.rowRelease)
		}
		return err
	})
}

// discard closes c's underlying connection instead of returning it to the
// pool.
func discard(c *sql.Conn) {
	_ = c.Raw(func(any) error { return sqldriver.ErrBadConn })
	_ = c.Close()
}

// sessionRenew proves each pinned connection is alive and re-arms its
// wait_timeout to the lease's TTL.
func (d *Driver) sessionRenew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	return d.sess.Renew(ctx, ls, func(ctx context.Context, c pinned, ttl time.Duration) error {
		_, err := c.ExecContext(ctx, fill(d.q.ping, "{WT}", waitTimeout(ttl)))
		return err
	}), nil
}

// holderConnID returns the server connection id holding name in this
// driver, for tests that KILL it from outside.
func (d *Driver) holderConnID(ctx context.Context, name string) (int64, bool) {
	h := d.sess.Get(name)
	if h == nil {
		return 0, false
	}
	c, ok := h.Conn()
	if !ok {
		return 0, false
	}
	var id int64
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return 0, false
	}
	return id, true
}
