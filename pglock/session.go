package pglock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
)

// pinned is the connection a session-mode lock pins for as long as it is
// held, with what the driver's SQL needs to know about its lock.
type pinned struct {
	*pgxpool.Conn
	key        int64 // advisory key
	pid        uint32
	oldTimeout string // idle_session_timeout before we armed it ("" = not armed)
	timeoutMS  string // the server-side idle timeout armed: one TTL, in ms
}

// Discard implements sqlcommon.Conn: it closes the connection, ending its
// session.
func (c *pinned) Discard() {
	pc := c.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = pc.Close(ctx)
	cancel()
}

// Abandon implements sqlcommon.Conn.
func (c *pinned) Abandon() func() {
	pc := c.Hijack()
	return func() { _ = pc.PgConn().Conn().Close() }
}

// pinTimeout bounds the wait for a free pool connection to pin: a full pool
// means held locks pin every connection, and TryAcquire must not hang.
const pinTimeout = 3 * time.Second

// AdvisoryKey returns the 64-bit key ModeAdvisory passes to
// pg_try_advisory_lock for name: the first 8 bytes of SHA-256("dlock\x00" +
// name). Two names collide with probability about 2^-64 per pair; other
// applications' advisory locks on the same database share the key space.
func AdvisoryKey(name string) int64 {
	sum := sha256.Sum256([]byte("dlock\x00" + name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

func (d *Driver) sessionAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	pin := func(ctx context.Context) (*pinned, error) {
		pctx, cancel := context.WithTimeout(ctx, pinTimeout)
		conn, err := d.pool.Acquire(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && pctx.Err() != nil {
				return nil, fmt.Errorf("pglock: acquire: no free pool connection within %v (every held lock pins one; pool size %d)", pinTimeout, d.pool.Config().MaxConns)
			}
			return nil, fmt.Errorf("pglock: acquire: pinning a connection: %w", err)
		}
		return &pinned{Conn: conn, key: AdvisoryKey(req.Name), pid: conn.Conn().PgConn().PID(), timeoutMS: timeoutMS(req.TTL)}, nil
	}
	lock := func(ctx context.Context, c *pinned) (bool, uint64, error) {
		if d.mode == ModeAdvisory {
			return d.advisoryLock(ctx, c, req.Name, req.Owner)
		}
		return d.rowLock(ctx, c, req.Name, req.Owner)
	}
	return d.sess.Acquire(ctx, req, string(d.mode), pin, lock, func(c *pinned) { d.abortPin(c.Conn) })
}

// abortPin undoes a failed acquire on a pinned connection. The lock may
// have been taken before the failure (an advisory lock is not
// transactional; the row lock's transaction is still open), so it is given
// up explicitly, which frees it at once, and the connection goes back to
// the pool; if that fails too, the connection is closed, which frees the
// lock once the server notices.
func (d *Driver) abortPin(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var err error
	if !conn.Conn().PgConn().IsClosed() {
		if d.mode == ModeAdvisory {
			_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock_all()")
		} else {
			_, err = conn.Exec(ctx, "ROLLBACK")
		}
	}
	if err != nil || conn.Conn().PgConn().IsClosed() {
		_ = conn.Hijack().Close(ctx)
		return
	}
	conn.Release()
}

// advisoryLock tries the advisory lock and, if granted, bumps the fence in
// the same autocommitted statement.
func (d *Driver) advisoryLock(ctx context.Context, c *pinned, name, owner string) (bool, uint64, error) {
	var (
		ok    bool
		fence int64
		old   string
	)
	var row pgx.Row
	if d.pgVer >= 140000 {
		row = c.QueryRow(ctx, d.q.advisoryAcquire, c.key, name, owner, c.timeoutMS)
	} else {
		row = c.QueryRow(ctx, d.q.advisoryAcquire13, c.key, name, owner)
	}
	if err := row.Scan(&ok, &fence, &old); err != nil {
		return false, 0, err
	}
	c.oldTimeout = old
	return ok, uint64(fence), nil
}

// rowLock opens a transaction on the pinned connection and locks the name's
// row with FOR UPDATE NOWAIT. The fencing counter is then bumped on another
// pooled connection in autocommit: an increment inside the held transaction
// would be rolled back if the holder crashed, and the next holder would be
// handed the same token again.
func (d *Driver) rowLock(ctx context.Context, c *pinned, name, owner string) (bool, uint64, error) {
	for attempt := 0; ; attempt++ {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(d.q.rowLock, name, c.timeoutMS)
		br := c.SendBatch(ctx, b)
		_, err := br.Exec()
		var set string
		if err == nil {
			err = br.QueryRow().Scan(&set)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		switch {
		case err == nil:
		case isNoRows(err) && attempt == 0:
			if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
				return false, 0, err
			}
			if _, err := c.Exec(ctx, d.q.rowEnsure, name); err != nil {
				return false, 0, err
			}
			continue
		case isLockNotAvailable(err):
			_, rerr := c.Exec(ctx, "ROLLBACK")
			return false, 0, rerr
		default:
			return false, 0, err
		}
		// Bounded: with every pool connection pinned by held locks this
		// would otherwise wait for a release that may never come.
		fctx, cancel := context.WithTimeout(ctx, pinTimeout)
		var fence int64
		err = d.pool.QueryRow(fctx, d.q.fenceBump, name, owner).Scan(&fence)
		cancel()
		if err != nil {
			return false, 0, fmt.Errorf("bumping the fencing counter on a second connection (the pool needs one more than the locks held): %w", err)
		}
		return true, uint64(fence), nil
	}
}

func (d *Driver) sessionRelease(ctx context.Context, l driver.Lease) (int, error) {
	return d.sess.Release(ctx, l, func(ctx context.Context, c *pinned) error {
		if d.mode != ModeAdvisory {
			b := &pgx.Batch{}
			b.Queue(d.q.rowNotify, d.channel, l.Name)
			b.Queue("COMMIT")
			return c.SendBatch(ctx, b).Close()
		}
		var (
			released bool
			notified *bool
			err      error
		)
		if c.oldTimeout != "" {
			err = c.QueryRow(ctx, d.q.advisoryReleaseReset, c.key, d.channel, l.Name, c.oldTimeout).Scan(&released, &notified, nil)
		} else {
			err = c.QueryRow(ctx, d.q.advisoryRelease, c.key, d.channel, l.Name).Scan(&released, &notified)
		}
		if err == nil && !released {
			err = errors.New("pg_advisory_unlock found no lock on the session")
		}
		return err
	})
}

// sessionRenew proves each pinned connection is alive and re-arms its
// server-side idle timeout to the lease's TTL.
func (d *Driver) sessionRenew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	return d.sess.Renew(ctx, ls, func(ctx context.Context, c *pinned, ttl time.Duration) error {
		ms := timeoutMS(ttl)
		var err error
		switch {
		case d.mode == ModeRowLock:
			_, err = c.Exec(ctx, d.q.rowPing, ms)
		case c.oldTimeout != "":
			_, err = c.Exec(ctx, d.q.advisoryPing, ms)
		default:
			_, err = c.Exec(ctx, "SELECT 1")
		}
		return err
	}), nil
}

// holderPID returns the backend PID of the connection holding name in this
// driver, for tests that terminate it from outside.
func (d *Driver) holderPID(name string) (uint32, bool) {
	if h := d.sess.Get(name); h != nil {
		if c, ok := h.Conn(); ok {
			return c.pid, true
		}
	}
	return 0, false
}

func timeoutMS(ttl time.Duration) string {
	return strconv.FormatInt(int64(max((ttl+time.Millisecond-1)/time.Millisecond, 1)), 10)
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
