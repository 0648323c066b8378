package mysqllock

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// pinned is the connection a session-mode lock pins for as long as it is
// held. The server is asked once per hold, so GET_LOCK's own re-entrance
// never comes into play.
type pinned struct {
	*sql.Conn
	losses *connLosses // the driver's
}

// Release implements sqlcommon.Conn: it returns the connection to the pool.
func (c pinned) Release() { _ = c.Close() }

// Discard implements sqlcommon.Conn: it closes the connection, ending its
// session.
func (c pinned) Discard() {
	c.losses.forget(c.Conn)
	discard(c.Conn)
}

// connLosses keeps the loss signal of each pooled connection the driver's
// session-mode locks have pinned (see pinned.Loss), keyed by database/sql's
// driver connection, which stays the same for the life of the connection.
// All methods are safe for concurrent use.
type connLosses struct {
	mu sync.Mutex
	m  map[any]*sqlcommon.ConnLoss
}

// maxConnLosses bounds connLosses: connections database/sql closes on its
// own (idle, lifetime) leave their entries behind, so past it the map
// starts afresh (a hold in progress keeps its signal; the next hold on its
// connection gets a new one).
const maxConnLosses = 1024

func newConnLosses() *connLosses { return &connLosses{m: map[any]*sqlcommon.ConnLoss{}} }

// driverConn returns c's driver connection, nil if c is closed.
func driverConn(c *sql.Conn) any {
	var dc any
	_ = c.Raw(func(x any) error { dc = x; return nil })
	return dc
}

// Loss implements sqlcommon.LossKeeper: the holds made on one pooled
// connection, one after another, share its loss signal, so an uncontended
// Lock+Unlock through a Client reuses the Client's idle loss watcher
// instead of starting a goroutine to watch each grant.
func (c pinned) Loss() *sqlcommon.ConnLoss {
	dc := driverConn(c.Conn)
	if c.losses == nil || dc == nil {
		return sqlcommon.NewConnLoss()
	}
	ls := c.losses
	ls.mu.Lock()
	defer ls.mu.Unlock()
	l := ls.m[dc]
	if l == nil || l.Ended() {
		if len(ls.m) >= maxConnLosses {
			clear(ls.m)
		}
		l = sqlcommon.NewConnLoss()
		ls.m[dc] = l
	}
	return l
}

// forget drops the entry of c, which is being closed.
func (ls *connLosses) forget(c *sql.Conn) {
	if ls == nil {
		return
	}
	if dc := driverConn(c); dc != nil {
		ls.mu.Lock()
		delete(ls.m, dc)
		ls.mu.Unlock()
	}
}

// Abandon implements sqlcommon.Conn.
func (c pinned) Abandon() func() { return c.Discard }

// pinTimeout bounds the wait for a free connection to pin, or to increment
// a fence on: TryAcquire must not hang when held locks pin every connection
// the *sql.DB may open.
const pinTimeout = sqlcommon.PoolWait

// waitTimeout is the wait_timeout armed on a pinned session: the TTL in
// whole seconds, rounded up.
func waitTimeout(ttl time.Duration) string {
	return strconv.FormatInt(int64(max((ttl+time.Second-1)/time.Second, 1)), 10)
}

// session is what the session modes' SQL shares: the store, Pin and Ping.
type session struct{ *store }

// Pin implements sqlcommon.SessionSQL: a connection from the pool, waiting
// at most pinTimeout.
func (d session) Pin(ctx context.Context, _ driver.AcquireRequest) (pinned, error) {
	conn, err := poolWait(ctx, d.store, "mysqllock: acquire: pinning a connection", d.db.Conn)
	return pinned{conn, d.losses}, err
}

// poolWait runs f on the pool, waiting at most pinTimeout. Its error names
// the real cause (a refused or failed connection), and says the pool was
// exhausted only when that is why the wait ran out.
func poolWait[T any](ctx context.Context, d *store, what string, f func(context.Context) (T, error)) (T, error) {
	return sqlcommon.WithPoolWait(ctx, what, "every held lock pins one; see sql.DB.SetMaxOpenConns",
		func() (int, int) {
			st := d.db.Stats()
			return st.InUse, st.MaxOpenConnections
		}, f)
}

// abort undoes a failed acquire on a pinned connection with stmt, which
// gives up whatever lock the session may hold and restores its settings.
// The lock may have been taken before the failure, so it is given up
// explicitly (which frees it at once) and the session restored before the
// connection goes back to the pool; if that fails too, the connection is
// closed, which frees the lock once the server notices.
func abort(c pinned, stmt string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.ExecContext(ctx, stmt); err != nil {
		c.Discard()
		return
	}
	_ = c.Close()
}

// getLock is the SQL of ModeGetLock: GET_LOCK on the name's LockName, held
// by the pinned session.
type getLock struct{ session }

var _ sqlcommon.SessionSQL[pinned] = getLock{}

// Abort implements sqlcommon.SessionSQL.
func (getLock) Abort(c pinned) {
	abort(c, "SET SESSION wait_timeout = DEFAULT, @dlock_released = RELEASE_ALL_LOCKS()")
}

// Unlock implements sqlcommon.SessionSQL.
func (g getLock) Unlock(ctx context.Context, c pinned, name string) error {
	_, err := c.ExecContext(ctx, fill(g.q.getLockRelease, "{L}", hexLit(LockName(name)), "{W}", hexLit(SignalName(name))))
	return err
}

// Lock implements sqlcommon.SessionSQL. It takes GET_LOCK(name, 0),
// arming wait_timeout in the same statement, then bumps the fence in an
// autocommitted statement gated on the grant: both in one query when the
// connections accept several statements (store.multi), which saves a
// round trip. On refusal the session is left as it was.
func (g getLock) Lock(ctx context.Context, c pinned, req driver.AcquireRequest) (bool, uint64, error) {
	stmt := fill(g.q.getLock, "{L}", hexLit(LockName(req.Name)), "{W}", hexLit(SignalName(req.Name)), "{WT}", waitTimeout(req.TTL))
	if g.multi.Load() && g.testHookLocked == nil {
		// The increment runs only if the GET_LOCK statement did (an error
		// ends the query), and is gated on the grant as apart.
		res, err := c.ExecContext(ctx, stmt+"; "+g.fenceInsert(req.Name, req.Owner))
		if err != nil {
			return false, 0, err
		}
		return granted(c.Conn, res)
	}
	return g.lockWith(ctx, c, req, func(ctx context.Context) error {
		_, err := c.ExecContext(ctx, stmt)
		return err
	})
}

var _ sqlcommon.SessionBlocker[pinned] = getLock{}

// Block implements sqlcommon.SessionBlocker: Lock with GET_LOCK(name,
// wait), which waits in the server. The server grants the lock to its
// waiting sessions in the order they came, the moment its holder lets go.
// When ctx ends, the wait is ended by a KILL QUERY of the session from
// another pooled connection (see sqlcommon.CancelOnDone; GET_LOCK then
// returns NULL).
func (g getLock) Block(ctx context.Context, c pinned, req driver.AcquireRequest, wait time.Duration) (bool, uint64, error) {
	id, err := g.ids.of(ctx, c.Conn)
	if err != nil {
		return false, 0, err
	}
	secs := strconv.FormatFloat(max(wait.Seconds(), 0.001), 'f', 3, 64)
	stmt := fill(g.q.getLockWait, "{L}", hexLit(LockName(req.Name)), "{W}", hexLit(SignalName(req.Name)), "{T}", secs, "{WT}", waitTimeout(req.TTL))
	return g.lockWith(ctx, c, req, func(ctx context.Context) error {
		// A KILL QUERY that finds the session idle changes nothing.
		kill := func(ctx context.Context) error {
			_, err := g.db.ExecContext(ctx, "KILL QUERY "+strconv.FormatInt(id, 10))
			return err
		}
		return sqlcommon.CancelOnDone(ctx, kill, func(qctx context.Context) error {
			_, err := c.ExecContext(qctx, stmt)
			return err
		})
	})
}

// lockWith runs take, the GET_LOCK statement, and then the fence bump,
// gated on the grant.
func (g getLock) lockWith(ctx context.Context, c pinned, req driver.AcquireRequest, take func(context.Context) error) (bool, uint64, error) {
	d, conn, name, owner := g.store, c.Conn, req.Name, req.Owner
	if err := take(ctx); err != nil {
		return false, 0, err
	}
	if d.testHookLocked != nil {
		d.testHookLocked(ctx, conn)
	}
	res, err := conn.ExecContext(ctx, g.fenceInsert(name, owner))
	if err != nil {
		return false, 0, err
	}
	return granted(conn, res)
}

// fenceInsert is the fence increment of name for owner, gated on this
// session holding name's GET_LOCK.
func (g getLock) fenceInsert(name, owner string) string {
	return fill(g.q.fenceInsert, "{K}", hexLit(name), "{O}", hexLit(owner), "{L}", hexLit(LockName(name)))
}

// granted reads the fence increment's result (the last statement's, when
// the query had several): no row inserted or updated means not granted,
// else the token is its LAST_INSERT_ID.
func granted(conn *sql.Conn, res sql.Result) (bool, uint64, error) {
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, 0, err // not granted: nothing inserted or updated
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, 0, err
	}
	if err := alive(conn); err != nil {
		return false, 0, err
	}
	return true, uint64(id), nil
}

// connIDs caches the CONNECTION_ID() of the pooled connections that
// session-mode waits ran on, keyed by database/sql's driver connection. It
// is safe for concurrent use.
type connIDs struct {
	mu sync.Mutex
	m  map[any]int64
}

// of returns c's CONNECTION_ID(), asking the server the first time.
func (ids *connIDs) of(ctx context.Context, c *sql.Conn) (int64, error) {
	dc := driverConn(c)
	ids.mu.Lock()
	id, ok := ids.m[dc]
	ids.mu.Unlock()
	if ok && dc != nil {
		return id, nil
	}
	if err := c.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return 0, err
	}
	ids.mu.Lock()
	if ids.m == nil || len(ids.m) >= maxConnLosses {
		ids.m = map[any]int64{}
	}
	ids.m[dc] = id
	ids.mu.Unlock()
	return id, nil
}

// errClosedUnder is the error of a statement that succeeded on a pinned
// connection the driver then closed (see alive).
var errClosedUnder = fmt.Errorf("the connection was closed as the statement completed (its context ended), which ended the session and its lock: %w", driver.ErrSessionLost)

// alive reports an error when c's connection has been closed. A statement
// can succeed and its connection be closed all the same: go-sql-driver
// watches the statement's context on a goroutine that, when the context
// ends just as the reply arrives, may pick the context over the statement's
// completion and close the connection (before ExecContext or Scan returns,
// so the check right after them is reliable). The server then ends the
// session and frees every GET_LOCK and row lock it had, so a grant or a
// ping confirmed on such a connection must not count.
func alive(c *sql.Conn) error {
	return c.Raw(func(dc any) error {
		if v, ok := dc.(sqldriver.Validator); ok && !v.IsValid() {
			return errClosedUnder
		}
		return nil
	})
}

// rowLock is the SQL of ModeRowLock: SELECT … FOR UPDATE NOWAIT on the
// name's row, in a transaction the pinned session keeps open.
type rowLock struct{ session }

var _ sqlcommon.SessionSQL[pinned] = rowLock{}

// Abort implements sqlcommon.SessionSQL.
func (rowLock) Abort(c pinned) {
	abort(c, "SET autocommit = 1, SESSION wait_timeout = DEFAULT, SESSION innodb_lock_wait_timeout = DEFAULT, @dlock_signal = RELEASE_ALL_LOCKS()") // ends the transaction
}

// Unlock implements sqlcommon.SessionSQL.
func (r rowLock) Unlock(ctx context.Context, c pinned, name string) error {
	_, err := c.ExecContext(ctx, fill(r.q.rowRelease, "{W}", hexLit(SignalName(name))))
	return err
}

// Lock implements sqlcommon.SessionSQL. It turns autocommit off and arms
// wait_timeout, then locks the name's row with FOR UPDATE NOWAIT (in one
// query when the connections accept several statements, store.multi); the
// transaction that read opened stays open until release. (Block is the same
// with a locking read that waits.) The fencing counter is incremented on
// another pooled connection in autocommit: an increment inside the held
// transaction would be rolled back if the holder crashed, and the next
// holder would be handed the same token again.
//
// Between the row lock and the increment the pinned session may die (it is
// KILLed, wait_timeout fires, the network drops it). A later holder may then
// lock the row and increment first, and this increment would hand the dead
// session the larger token. So the grant is only returned once the pinned
// session, after the increment, takes the row again with FOR UPDATE NOWAIT:
// it succeeds at once only if this session's transaction still holds the
// row. The transaction cannot have ended and been replaced by a new one
// meanwhile: it ends with its session, with a COMMIT or ROLLBACK (not sent
// before release), or with an error that rolls back the whole transaction
// (a deadlock, or a lock wait timeout under innodb_rollback_on_timeout),
// and once it holds the row the pinned session never waits for a lock
// (the confirmation is NOWAIT), so no such error can occur. (Block's
// locking read waits, but before the row is held: a timeout or deadlock
// there ends a transaction that holds nothing.) A confirmation therefore
// proves the row lock was held from before the increment until after it,
// and every later holder's increment comes after ours.
func (r rowLock) Lock(ctx context.Context, c pinned, req driver.AcquireRequest) (bool, uint64, error) {
	return r.lockRow(ctx, c, req, 0)
}

var _ sqlcommon.SessionBlocker[pinned] = rowLock{}

// Block implements sqlcommon.SessionBlocker: Lock whose locking read waits
// for the row (FOR UPDATE without NOWAIT) up to wait, in whole seconds
// (innodb_lock_wait_timeout, for this session until the release; the
// driver's Queues sends only waits of a second or more). InnoDB queues the
// transactions waiting for a row and grants it to the first when its
// holder's transaction ends. When ctx ends, the wait is ended by a KILL
// QUERY of the session from another pooled connection (see
// sqlcommon.CancelOnDone).
func (r rowLock) Block(ctx context.Context, c pinned, req driver.AcquireRequest, wait time.Duration) (bool, uint64, error) {
	return r.lockRow(ctx, c, req, max(int(wait/time.Second), 1))
}

// lockRow is Lock of a mutex, whose locking read waits up to waitSecs
// seconds for the row when waitSecs is above 0 (Block), and refuses at
// once otherwise.
func (r rowLock) lockRow(ctx context.Context, c pinned, req driver.AcquireRequest, waitSecs int) (bool, uint64, error) {
	d, conn, name, owner := r.store, c.Conn, req.Name, req.Owner
	set, lock := "SET autocommit = 0, SESSION wait_timeout = "+waitTimeout(req.TTL), d.q.rowLock
	var id int64
	if waitSecs > 0 {
		set += ", SESSION innodb_lock_wait_timeout = " + strconv.Itoa(waitSecs)
		lock = d.q.rowLockWait
		var err error
		if id, err = r.ids.of(ctx, conn); err != nil {
			return false, 0, err
		}
	}
	k := hexLit(name)
	read := func(ctx context.Context) error { return queryRow(ctx, conn, fill(lock, "{K}", k)) }
	if r.multi.Load() && waitSecs == 0 {
		// One query (see store.multi): go-sql-driver/mysql skips the SET's
		// empty result to the locking read's rows; an error in the SET ends
		// the query before the read.
		read = func(ctx context.Context) error { return queryRow(ctx, conn, set+"; "+fill(lock, "{K}", k)) }
	} else if _, err := conn.ExecContext(ctx, set); err != nil {
		return false, 0, err
	}
	if waitSecs > 0 {
		wait := read
		read = func(ctx context.Context) error {
			// A KILL QUERY that finds the session idle changes nothing.
			kill := func(ctx context.Context) error {
				_, err := r.db.ExecContext(ctx, "KILL QUERY "+strconv.FormatInt(id, 10))
				return err
			}
			return sqlcommon.CancelOnDone(ctx, kill, wait)
		}
	}
	for attempt := 0; ; attempt++ {
		err := read(ctx)
		switch {
		case err == nil:
		case errors.Is(err, sql.ErrNoRows) && attempt == 0:
			// First use of the name: end this transaction (its locking
			// read may hold a gap lock) and create the row in autocommit.
			if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				return false, 0, err
			}
			_, err := poolWait(ctx, d, "creating the lock's row on a second connection", func(ctx context.Context) (sql.Result, error) {
				return d.db.ExecContext(ctx, fill(d.q.rowEnsure, "{K}", k))
			})
			if err != nil {
				return false, 0, err
			}
			continue
		case isLockNotAvailable(err), waitSecs > 0 && isInterrupted(err) && ctx.Err() == nil:
			// Held (NOWAIT, or the wait's innodb_lock_wait_timeout), or a
			// wait the server cut short (an administrator's KILL QUERY):
			// refused.
			_, rerr := conn.ExecContext(ctx, fill(d.q.rowRelease, "{W}", hexLit(SignalName(name))))
			return false, 0, rerr
		default:
			return false, 0, err
		}
		if d.testHookLocked != nil {
			d.testHookLocked(ctx, conn)
		}
		// Bounded: with every connection pinned by held locks this would
		// otherwise wait for a release that may never come.
		res, err := poolWait(ctx, d, "incrementing the fencing counter on a second connection (the pool needs one more than the locks held)",
			func(ctx context.Context) (sql.Result, error) {
				return d.db.ExecContext(ctx, fill(d.q.fenceBump, "{K}", k, "{O}", hexLit(owner)))
			})
		if err != nil {
			return false, 0, err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return false, 0, err
		}
		// The row, again, and the wake-up signal, taken if free.
		if err := queryRow(ctx, conn, fill(d.q.rowConfirm, "{K}", k, "{W}", hexLit(SignalName(name)))); err != nil {
			return false, 0, fmt.Errorf("the pinned session could not confirm its row lock after the fence increment (to %d), so the lock is not granted: %w: %w", id, driver.ErrSessionLost, err)
		}
		if err := alive(conn); err != nil {
			return false, 0, err
		}
		return true, uint64(id), nil
	}
}

// queryRow runs q on c and returns sql.ErrNoRows if it returned no row;
// the row's values are not read. It goes to go-sql-driver/mysql's
// connection directly (Conn.Raw), which watches ctx on the connection's own
// watcher goroutine: database/sql's QueryRowContext starts a goroutine per
// query whose context can end (Rows.awaitDone), two per Lock in
// ModeRowLock, where ModeGetLock, whose statements are all ExecContext,
// started none (see TestSessionLockStartsNoGoroutine). An error that
// leaves the connection unusable (driver.ErrBadConn) makes Raw close it,
// as database/sql does after a query.
func queryRow(ctx context.Context, c *sql.Conn, q string) error {
	return c.Raw(func(dc any) error {
		qc, ok := dc.(sqldriver.QueryerContext)
		if !ok {
			return fmt.Errorf("mysqllock: the driver connection (%T) cannot run queries", dc)
		}
		rows, err := qc.QueryContext(ctx, q, nil)
		if err != nil {
			return err
		}
		err = rows.Next(make([]sqldriver.Value, len(rows.Columns())))
		if err == io.EOF {
			err = sql.ErrNoRows
		}
		if cerr := rows.Close(); cerr != nil && (err == nil || err == sql.ErrNoRows) {
			err = cerr
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

// Ping implements sqlcommon.SessionSQL for both session modes: it proves
// the session alive and re-arms its wait_timeout to ttl.
func (d session) Ping(ctx context.Context, c pinned, ttl time.Duration) error {
	if _, err := c.ExecContext(ctx, fill(d.q.ping, "{WT}", waitTimeout(ttl))); err != nil {
		return err
	}
	return alive(c.Conn)
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
