package pglock

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Read/write locks in ModeRowLock. Row locks have a shared form: a reader
// holds SELECT … FOR SHARE NOWAIT and a writer SELECT … FOR UPDATE NOWAIT
// on the name's read/write row of <table>_rowlock (RowKey), each in a
// transaction left open on its own pinned connection, so the server keeps
// any number of readers or one writer, and a session's end frees its hold.
// The token is the name's read/write counter in <table>_kinds, incremented
// on a second pooled connection in autocommit once the row is locked, and
// the grant is returned only after the pinned transaction confirms it
// still holds the row (the same locking read again), as for the mutex:
// a writer can only lock the row once every reader's transaction has ended,
// after their increments. Writer preference uses the lease mode's mark
// rows: a reader's pipelined first statements read whether another
// owner's mark is live and give the row up at once if so; a refused
// waiting writer leaves its mark, and its grant deletes it. Semaphores are
// not offered in this mode.

// RowKey returns the <table>_rowlock row of name's read/write lock in
// ModeRowLock: "\x01rw\x01" + name, which no lock name (they have no
// control characters) can equal.
func RowKey(name string) string { return "\x01rw\x01" + name }

type rowKindQueries struct {
	lockShare, lockUpdate, marked, bump, mark string
}

func newRowKindQueries(table string) rowKindQueries {
	r := strings.NewReplacer("$T", table)
	lock := `SELECT set_config('idle_in_transaction_session_timeout', $2, true) FROM $T_rowlock WHERE name = $1 FOR `
	return rowKindQueries{
		lockShare:  r.Replace(lock + `SHARE NOWAIT`),
		lockUpdate: r.Replace(lock + `UPDATE NOWAIT`),
		marked: r.Replace(`SELECT EXISTS (SELECT 1 FROM $T_holders WHERE name = $1 AND grp = 1 AND kind = 9 AND owner <> $2
	AND lock_until > ` + nowUS + `)`),
		// The writer's own mark goes with its grant's increment.
		bump: r.Replace(`WITH dm AS (DELETE FROM $T_holders WHERE name = $1 AND grp = 1 AND kind = 9 AND owner = $2 AND $3)
INSERT INTO $T_kinds AS k (name, grp, fence) VALUES ($1, 1, 1)
ON CONFLICT (name, grp) DO UPDATE SET fence = k.fence + 1
RETURNING fence`),
		mark: r.Replace(`INSERT INTO $T_holders (name, grp, owner, kind, count, fence, lock_until, delay_until)
VALUES ($1, 1, $2, 9, 1, 0, ` + nowUS + ` + $3, ` + nowUS + ` + $3)
ON CONFLICT (name, grp, owner, kind) DO UPDATE SET lock_until = excluded.lock_until, delay_until = excluded.delay_until`),
	}
}

// lockKind is rowLock.Lock for a Read or Write request.
func (r rowLock) lockKind(ctx context.Context, c *pinned, req driver.AcquireRequest) (bool, uint64, error) {
	d, q := r.store, r.q.rowKinds
	key := RowKey(req.Name)
	lock := q.lockShare
	if req.Kind == driver.Write {
		lock = q.lockUpdate
	}
	for attempt := 0; ; attempt++ {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(q.marked, req.Name, req.Owner)
		b.Queue(lock, key, c.timeoutMS)
		br := c.SendBatch(ctx, b)
		_, err := br.Exec()
		var marked bool
		if err == nil {
			err = br.QueryRow().Scan(&marked)
		}
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
			if err := d.ensureRow(ctx, c, key); err != nil {
				return false, 0, err
			}
			continue
		case isLockNotAvailable(err):
			if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
				return false, 0, err
			}
			if req.Kind == driver.Write && req.Waiting {
				if _, err := d.pool.Exec(ctx, q.mark, req.Name, req.Owner, sqlcommon.Micros(req.TTL)); err != nil {
					return false, 0, err
				}
			}
			return false, 0, nil
		default:
			return false, 0, err
		}
		if req.Kind == driver.Read && marked {
			// Held back by a waiting writer: give the share up at once.
			_, err := c.Exec(ctx, "ROLLBACK")
			return false, 0, err
		}
		if d.testHookLocked != nil {
			d.testHookLocked(ctx, c)
		}
		fence, err := d.bumpKind(ctx, req)
		if err != nil {
			return false, 0, err
		}
		if err := c.QueryRow(ctx, lock, key, c.timeoutMS).Scan(&set); err != nil {
			return false, 0, fmt.Errorf("the pinned session could not confirm its row lock after the counter increment (to %d), so the lock is not granted: %w: %w", fence, driver.ErrSessionLost, err)
		}
		return true, uint64(fence), nil
	}
}

// bumpKind increments name's read/write counter on a second pool
// connection in autocommit (deleting a writer's own mark with it) and
// returns its new value.
func (d *store) bumpKind(ctx context.Context, req driver.AcquireRequest) (int64, error) {
	const what = "incrementing the read/write counter on a second connection"
	conn, err := d.poolConn(ctx, what+" (the pool needs one more than the locks held)")
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var fence int64
	if err := conn.QueryRow(ctx, d.q.rowKinds.bump, req.Name, req.Owner, req.Kind == driver.Write).Scan(&fence); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return fence, nil
}
