package pglock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// hold is one lock held in a session mode: the pinned connection and the
// local re-entrance count. It is the Handle of every grant on it.
type hold struct {
	name  string
	owner string
	key   int64 // advisory key
	token uint64
	pid   uint32
	lost  *sqlcommon.Lost

	mu         sync.Mutex // serialises use of conn
	conn       *pgxpool.Conn
	count      int
	oldTimeout string // idle_session_timeout before we armed it ("" = not armed)
	timeoutMS  string // the server-side idle timeout armed: one TTL, in ms
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
	conn, err := d.pool.Acquire(pctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && pctx.Err() != nil {
			return driver.Grant{}, fmt.Errorf("pglock: acquire: no free pool connection within %v (every held lock pins one; pool size %d)", pinTimeout, d.pool.Config().MaxConns)
		}
		return driver.Grant{}, fmt.Errorf("pglock: acquire: pinning a connection: %w", err)
	}
	h = &hold{name: req.Name, owner: req.Owner, key: AdvisoryKey(req.Name), conn: conn, count: 1,
		pid: conn.Conn().PgConn().PID(), lost: sqlcommon.NewLost(), timeoutMS: timeoutMS(req.TTL)}
	var ok bool
	if d.mode == ModeAdvisory {
		ok, err = d.advisoryLock(ctx, h)
	} else {
		ok, err = d.rowLock(ctx, h)
	}
	if err != nil {
		d.abortPin(conn)
		return driver.Grant{}, fmt.Errorf("pglock: acquire: %w", err)
	}
	if !ok {
		conn.Release()
		return driver.Grant{}, &driver.LockedError{}
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		h.destroy(errors.New("pglock: driver closed"))
		return driver.Grant{}, errors.New("pglock: driver is closed")
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

func (h *hold) grant(ttl time.Duration) driver.Grant {
	return driver.Grant{Token: h.token, Count: h.count, TTL: ttl, Handle: h, Lost: h.lost.C(), Cause: h.lost.Cause}
}

// advisoryLock tries the advisory lock and, if granted, bumps the fence in
// the same autocommitted statement.
func (d *Driver) advisoryLock(ctx context.Context, h *hold) (bool, error) {
	var (
		ok    bool
		fence int64
		old   string
	)
	var row pgx.Row
	if d.pgVer >= 140000 {
		row = h.conn.QueryRow(ctx, d.q.advisoryAcquire, h.key, h.name, h.owner, h.timeoutMS)
	} else {
		row = h.conn.QueryRow(ctx, d.q.advisoryAcquire13, h.key, h.name, h.owner)
	}
	if err := row.Scan(&ok, &fence, &old); err != nil {
		return false, err
	}
	h.token, h.oldTimeout = uint64(fence), old
	return ok, nil
}

// rowLock opens a transaction on the pinned connection and locks the name's
// row with FOR UPDATE NOWAIT. The fencing counter is then bumped on another
// pooled connection in autocommit: an increment inside the held transaction
// would be rolled back if the holder crashed, and the next holder would be
// handed the same token again.
func (d *Driver) rowLock(ctx context.Context, h *hold) (bool, error) {
	for attempt := 0; ; attempt++ {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(d.q.rowLock, h.name, h.timeoutMS)
		br := h.conn.SendBatch(ctx, b)
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
			if _, err := h.conn.Exec(ctx, "ROLLBACK"); err != nil {
				return false, err
			}
			if _, err := h.conn.Exec(ctx, d.q.rowEnsure, h.name); err != nil {
				return false, err
			}
			continue
		case isLockNotAvailable(err):
			_, rerr := h.conn.Exec(ctx, "ROLLBACK")
			return false, rerr
		default:
			return false, err
		}
		// Bounded: with every pool connection pinned by held locks this
		// would otherwise wait for a release that may never come.
		fctx, cancel := context.WithTimeout(ctx, pinTimeout)
		var fence int64
		err = d.pool.QueryRow(fctx, d.q.fenceBump, h.name, h.owner).Scan(&fence)
		cancel()
		if err != nil {
			return false, fmt.Errorf("bumping the fencing counter on a second connection (the pool needs one more than the locks held): %w", err)
		}
		h.token = uint64(fence)
		return true, nil
	}
}

// lookup finds the hold behind l and checks that l is a grant on it.
func (d *Driver) lookup(l driver.Lease) (*hold, error) {
	h, _ := l.Handle.(*hold)
	if h == nil || h.name != l.Name || h.owner != l.Owner || h.token != l.Token {
		return nil, fmt.Errorf("pglock: lease was not granted by this driver: %w", driver.ErrNotHeld)
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
			return 0, fmt.Errorf("pglock: release: %w", c)
		}
		return 0, fmt.Errorf("pglock: release: %w", driver.ErrNotHeld)
	}
	if h.count > 1 {
		h.count--
		return h.count, nil
	}
	if d.mode == ModeAdvisory {
		var released bool
		var notified *bool
		if h.oldTimeout != "" {
			err = h.conn.QueryRow(ctx, d.q.advisoryReleaseReset, h.key, d.channel, h.name, h.oldTimeout).Scan(&released, &notified, nil)
		} else {
			err = h.conn.QueryRow(ctx, d.q.advisoryRelease, h.key, d.channel, h.name).Scan(&released, &notified)
		}
		if err == nil && !released {
			err = errors.New("pg_advisory_unlock found no lock on the session")
		}
	} else {
		b := &pgx.Batch{}
		b.Queue(d.q.rowNotify, d.channel, h.name)
		b.Queue("COMMIT")
		err = h.conn.SendBatch(ctx, b).Close()
	}
	d.dropHold(h)
	if err != nil {
		// The connection's state is unknown: close it, which ends the
		// session and with it any lock it still had.
		pc := h.conn.Hijack()
		h.conn = nil
		_ = pc.Close(context.Background())
		cause := sqlcommon.SessionLost(err)
		h.lost.Close(cause)
		return 0, fmt.Errorf("pglock: release: %w", cause)
	}
	h.conn.Release()
	h.conn = nil
	h.count = 0
	return 0, nil
}

// dropHold removes h from the driver's table if it is still there.
func (d *Driver) dropHold(h *hold) {
	d.mu.Lock()
	if d.holds[h.name] == h {
		delete(d.holds, h.name)
	}
	d.mu.Unlock()
}

// destroy closes h's connection (ending its session and its lock) and
// signals loss with cause. The caller must not hold h.mu.
func (h *hold) destroy(cause error) {
	h.mu.Lock()
	if h.conn != nil {
		pc := h.conn.Hijack()
		h.conn = nil
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = pc.Close(ctx)
		cancel()
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
		if l.TTL > j.ttl {
			j.ttl = l.TTL
		}
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

// ping proves h's connection is alive and re-arms the server-side idle
// timeout to ttl. A failed ping ends the hold: the connection is closed, so
// whatever lock it had is gone on the server too.
func (d *Driver) ping(ctx context.Context, h *hold, ttl time.Duration) error {
	h.mu.Lock()
	if h.conn == nil {
		h.mu.Unlock()
		if c := h.lost.Cause(); c != nil {
			return c
		}
		return fmt.Errorf("pglock: renew: %w", driver.ErrNotHeld)
	}
	ms := timeoutMS(ttl)
	var err error
	switch {
	case d.mode == ModeRowLock:
		_, err = h.conn.Exec(ctx, d.q.rowPing, ms)
	case h.oldTimeout != "":
		_, err = h.conn.Exec(ctx, d.q.advisoryPing, ms)
	default:
		_, err = h.conn.Exec(ctx, "SELECT 1")
	}
	h.mu.Unlock()
	if err != nil {
		cause := sqlcommon.SessionLost(err)
		d.dropHold(h)
		h.destroy(cause)
		return fmt.Errorf("pglock: renew: %w", cause)
	}
	return nil
}

// holderPID returns the backend PID of the connection holding name in this
// driver, for tests that terminate it from outside.
func (d *Driver) holderPID(name string) (uint32, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h := d.holds[name]; h != nil {
		return h.pid, true
	}
	return 0, false
}

func timeoutMS(ttl time.Duration) string {
	return strconv.FormatInt(int64(max((ttl+time.Millisecond-1)/time.Millisecond, 1)), 10)
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
