package mysqllock

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Read/write locks and semaphores (driver.Kinder), in ModeLease only: two
// tables beside the lock table, <table>_kinds and <table>_holders, laid out
// and decided as internal/sqlcommon's kinds.go describes. An acquire is one
// transaction: a locking read of the lock's _kinds row joined with its
// holders (the _kinds row is locked first, so every acquire of the lock
// serialises on it, and a locking read sees the latest committed holders),
// then the writes sqlcommon.DecideKind asks for, then COMMIT; about five
// round trips, against one for a mutex. A release is one statement (two
// when the owner re-entered), a renewal one UPDATE per TTL group as for
// mutexes (a batch mixing mutexes and kinds is one more statement). The
// session modes (getlock, rowlock) hold only mutexes: a GET_LOCK has no
// shared form, so they refuse the kinds (SupportsKind false: the dlock
// package answers ErrUnsupported).

var (
	_ driver.Kinder        = (*Driver)(nil)
	_ driver.Withdrawer    = (*Driver)(nil)
	_ driver.MultiAcquirer = (*Driver)(nil)
	_ driver.FenceRaiser   = (*Driver)(nil)
)

// SupportsKind implements driver.Kinder: in ModeLease every kind; in the
// session modes the mutex only.
func (d *Driver) SupportsKind(k driver.Kind) bool {
	return k == driver.Exclusive || (d.mode == ModeLease && k <= driver.Permit)
}

func (d *Driver) unsupported(k driver.Kind) error {
	return fmt.Errorf("mysqllock: %s locks in mode %s (only mode lease has them): %w", k, d.mode, driver.ErrUnsupported)
}

// kindKey is the wake-up signal key of a holder of a kind (see
// leaseSignals.grantKey).
func kindKey(name string, k driver.Kind, owner string) string {
	return name + kindSuffix(k, owner)
}

// kindSuffix is what kindKey appends to the name.
func kindSuffix(k driver.Kind, owner string) string {
	return "\x00" + strconv.Itoa(int(k)) + "\x00" + owner
}

func itoa(n int) string           { return strconv.Itoa(n) }
func i64(n int64) string          { return strconv.FormatInt(n, 10) }
func u64(n uint64) string         { return strconv.FormatUint(n, 10) }
func grpLit(k driver.Kind) string { return itoa(sqlcommon.Group(k)) }

// kindTx is one acquire transaction (sqlcommon.KindTx).
type kindTx struct {
	st *store
	tx *sql.Tx
}

func (k *kindTx) Read(ctx context.Context, name string, grp int) (sqlcommon.KindState, []sqlcommon.Holder, error) {
	var st sqlcommon.KindState
	tx, err := k.st.db.BeginTx(ctx, nil)
	if err != nil {
		return st, nil, err
	}
	k.tx = tx
	read := fill(k.st.q.kindRead, "{K}", hexLit(name), "{G}", itoa(grp))
	for attempt := 0; ; attempt++ {
		found, hs, err := k.read(ctx, read, &st)
		if err != nil || found || attempt > 0 {
			if err == nil && !found {
				err = fmt.Errorf("the _kinds row of %q is missing after its insert", name)
			}
			return st, hs, err
		}
		if _, err := tx.ExecContext(ctx, fill(k.st.q.kindEnsure, "{K}", hexLit(name), "{G}", itoa(grp))); err != nil {
			return st, nil, err
		}
	}
}

// read runs the locking read; found is false when the _kinds row does not
// exist yet.
func (k *kindTx) read(ctx context.Context, q string, st *sqlcommon.KindState) (found bool, hs []sqlcommon.Holder, err error) {
	rows, err := k.tx.QueryContext(ctx, q)
	if err != nil {
		return false, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		found = true
		var (
			owner                        []byte
			kind, count                  sql.NullInt64
			fence, lockUntil, delayUntil sql.NullInt64
		)
		if err := rows.Scan(&st.Fence, &st.Permits, &st.Now, &owner, &kind, &count, &fence, &lockUntil, &delayUntil); err != nil {
			return false, nil, err
		}
		if kind.Valid {
			hs = append(hs, sqlcommon.Holder{Owner: string(owner), Kind: int(kind.Int64), Count: int(count.Int64),
				Fence: fence.Int64, LockUntil: lockUntil.Int64, DelayUntil: delayUntil.Int64})
		}
	}
	return found, hs, rows.Err()
}

func (k *kindTx) Write(ctx context.Context, name string, grp int, p sqlcommon.KindPlan) error {
	q := k.st.q
	K, G := hexLit(name), itoa(grp)
	var stmts []string
	if p.SetState {
		stmts = append(stmts, fill(q.kindSet, "{K}", K, "{G}", G, "{F}", i64(p.Fence), "{P}", itoa(p.Permits)))
	}
	if len(p.Delete) > 0 {
		rows := make([]string, len(p.Delete))
		for i, h := range p.Delete {
			rows[i] = "(" + hexLit(h.Owner) + "," + itoa(h.Kind) + ")"
		}
		stmts = append(stmts, fill(q.kindDelete, "{K}", K, "{G}", G, "{ROWS}", strings.Join(rows, ",")))
	}
	if h := p.Put; h != nil {
		stmts = append(stmts, fill(q.kindPut, "{K}", K, "{G}", G, "{O}", hexLit(h.Owner), "{KIND}", itoa(h.Kind),
			"{C}", itoa(h.Count), "{F}", i64(h.Fence), "{LU}", i64(h.LockUntil), "{DU}", i64(h.DelayUntil)))
	}
	for _, s := range stmts {
		if _, err := k.tx.ExecContext(ctx, s); err != nil {
			k.Abort()
			return err
		}
	}
	return k.tx.Commit()
}

func (k *kindTx) Abort() {
	if k.tx != nil {
		_ = k.tx.Rollback()
	}
}

// acquireKind is TryAcquire of a Read, Write or Permit request.
//
// Two first acquires of new names can deadlock on InnoDB's gap locks
// (each locking read of a missing row locks the gap the other inserts
// into); the server rolls one back, which is then tried again, at most
// twice, and otherwise reported as ErrLocked (nothing was taken).
func (d *leases) acquireKind(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := sqlcommon.AcquireKind(ctx, "mysqllock", &kindTx{st: d.store}, req)
	for i := 0; i < 2 && isDeadlock(err) && ctx.Err() == nil; i++ {
		g, err = sqlcommon.AcquireKind(ctx, "mysqllock", &kindTx{st: d.store}, req)
	}
	switch {
	case err == nil:
		if g.Count == 1 {
			d.sig.grantKey(kindKey(req.Name, req.Kind, req.Owner), req.Kind, req.Owner, d.sig.contended(req.Name, d.watches))
			if req.Kind == driver.Read {
				// Other readers waiting here may share it: a release
				// woke only the longest waiter.
				d.watches.WakeAll(req.Name)
			}
		}
	case isDeadlock(err):
		// Rolled back: nothing was taken.
		d.sig.refused(req.Name)
		return driver.Grant{}, &driver.LockedError{}
	case isLocked(err):
		d.sig.refused(req.Name)
	}
	return g, err
}

// isDeadlock reports InnoDB's deadlock (1213) and lock wait timeout (1205)
// errors, after which the transaction was rolled back.
func isDeadlock(err error) bool { n := errNumber(err); return n == 1213 || n == 1205 }

func isLocked(err error) bool {
	_, ok := err.(*driver.LockedError)
	return ok
}

// releaseKind is Release of a Read, Write or Permit lease: the last hold
// deletes the holder's row (its place is free at once, no lock-delay), an
// earlier one counts down.
func (d *leases) releaseKind(ctx context.Context, l driver.Lease) (int, error) {
	kv := []string{"{K}", hexLit(l.Name), "{G}", grpLit(l.Kind), "{O}", hexLit(l.Owner),
		"{KIND}", itoa(sqlcommon.HolderKind(l.Kind)), "{F}", u64(l.Token)}
	key := kindKey(l.Name, l.Kind, l.Owner)
	res, err := d.db.ExecContext(ctx, fill(d.q.kindReleaseLast, kv...))
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release "+l.Kind.String(), err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release "+l.Kind.String(), err)
	} else if n == 1 {
		awaitSignal(ctx, d.sig.releasedKey(key, l.Owner))
		return 0, nil
	}
	res, err = d.db.ExecContext(ctx, fill(d.q.kindRelease, kv...))
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release "+l.Kind.String(), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release "+l.Kind.String(), err)
	}
	if n == 0 {
		awaitSignal(ctx, d.sig.releasedKey(key, l.Owner))
		return 0, fmt.Errorf("mysqllock: release %s: %w", l.Kind, driver.ErrNotHeld)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release "+l.Kind.String(), err)
	}
	return int(id), nil
}

// renewKindChunk renews the kinds' leases ls[idx], which share ttl and
// ttld (TTL plus lock-delay, in µs), and sets errs[i] for those that were
// not renewed.
func (d *leases) renewKindChunk(ctx context.Context, ls []driver.Lease, idx []int, ttl, ttld int64, errs []error) error {
	var rows strings.Builder
	distinct := map[sqlcommon.LeaseKey]bool{}
	for j, i := range idx {
		l := ls[i]
		if j > 0 {
			rows.WriteByte(',')
		}
		fmt.Fprintf(&rows, "(%s,%d,%s,%d,%d)", hexLit(l.Name), sqlcommon.Group(l.Kind), hexLit(l.Owner), sqlcommon.HolderKind(l.Kind), l.Token)
		distinct[sqlcommon.KeyOf(l)] = true
	}
	res, err := d.db.ExecContext(ctx, fill(d.q.kindRenew, "{ROWS}", rows.String(), "{TTL}", i64(ttl), "{TTLD}", i64(ttld)))
	if err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	if int(n) == len(distinct) {
		return nil
	}
	keys := make([]string, 0, len(distinct))
	for k := range distinct {
		keys = append(keys, hexLit(k.Name))
	}
	r, err := d.db.QueryContext(ctx, fill(d.q.kindRenewed, "{KEYS}", strings.Join(keys, ",")))
	if err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	defer r.Close()
	live := map[sqlcommon.LeaseKey]bool{}
	for r.Next() {
		var (
			name, owner []byte
			k           sqlcommon.LeaseKey
		)
		if err := r.Scan(&name, &owner, &k.Kind, &k.Fence); err != nil {
			return ctxerr.Wrap(ctx, "mysqllock: renew", err)
		}
		k.Name, k.Owner = string(name), string(owner)
		live[k] = true
	}
	if err := r.Err(); err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	for _, i := range idx {
		l := ls[i]
		if !live[sqlcommon.KeyOf(l)] {
			d.sig.releasedKey(kindKey(l.Name, l.Kind, l.Owner), l.Owner)
			errs[i] = fmt.Errorf("mysqllock: renew %s: lease expired or taken over: %w", l.Kind, driver.ErrNotHeld)
		}
	}
	return nil
}

// Withdraw implements driver.Withdrawer: it deletes the mark req.Owner
// left as a waiting writer of req.Name, and wakes this driver's waiters of
// the name (readers in other processes were told the mark's time left as
// their retry hint).
func (d *Driver) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	if err := d.base.Ready(ctx); err != nil {
		return err
	}
	if d.mode != ModeLease {
		return nil // no marks are ever left
	}
	if _, err := d.db.ExecContext(ctx, fill(d.q.withdraw, "{K}", hexLit(req.Name), "{G}", itoa(sqlcommon.GroupRW),
		"{O}", hexLit(req.Owner), "{KIND}", itoa(sqlcommon.KindMark))); err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: withdraw", err)
	}
	// Readers the mark held back in this process may go in now.
	d.watches.WakeAll(req.Name)
	return nil
}

// RaiseFence implements driver.FenceRaiser. For a mutex whose lease is
// live, the holder's token stays as it is (its renewals and release match
// it) and the raise is kept in the row's fence_floor, which the next new
// grant reads; otherwise the counter itself is raised. For a read/write
// lock or a semaphore the counter in its _kinds row is raised (each holder
// keeps its token in its own row). It works in every mode for the mutex.
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if err := d.base.Ready(ctx); err != nil {
		return err
	}
	if atLeast > math.MaxInt64 {
		return fmt.Errorf("mysqllock: raise fence of %q to %d: above the largest token (2^63-1): %w", name, atLeast, driver.ErrInvalid)
	}
	var q string
	switch {
	case k == driver.Exclusive:
		q = fill(d.q.raiseMutex, "{K}", hexLit(name), "{F}", u64(atLeast))
	case d.SupportsKind(k):
		q = fill(d.q.raiseKind, "{K}", hexLit(name), "{G}", grpLit(k), "{F}", u64(atLeast))
	default:
		return d.unsupported(k)
	}
	if _, err := d.db.ExecContext(ctx, q); err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: raise fence", err)
	}
	return nil
}

// TryAcquireMulti implements driver.MultiAcquirer in ModeLease: one
// transaction runs each name's grant statement (the one TryAcquire runs)
// in order, and commits only if every one granted; at the first refusal
// (or a deadlock) it rolls back, leaving nothing taken. The session modes
// return ErrUnsupported (the dlock package then takes the names one by
// one).
func (d *Driver) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	if err := d.base.Ready(ctx); err != nil {
		return nil, err
	}
	l := d.lease
	if l == nil {
		return nil, fmt.Errorf("mysqllock: several locks in one transaction in mode %s: %w", d.mode, driver.ErrUnsupported)
	}
	for _, r := range reqs {
		if r.Kind != driver.Exclusive {
			return nil, fmt.Errorf("mysqllock: several locks at once: only mutexes: %w", driver.ErrUnsupported)
		}
	}
	gs, err := l.acquireMulti(ctx, reqs)
	if err != nil {
		return nil, err
	}
	for i, r := range reqs[:min(len(reqs), len(gs))] {
		// The signals keep a slice of the grant's key as the name (see
		// Driver.TryAcquire).
		key, r := sqlcommon.KeyedRequest(d.table, r)
		gs[i].Key = key
		if gs[i].Count == 1 {
			l.sig.grant(r.Name, r.Owner, l.sig.contended(r.Name, l.watches))
		}
	}
	return gs, nil
}

func (d *leases) acquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, ctxerr.Wrap(ctx, "mysqllock: acquire several", err)
	}
	gs := make([]driver.Grant, len(reqs))
	for i, r := range reqs {
		ttl := sqlcommon.Micros(r.TTL)
		ttld := ttl + sqlcommon.Micros(r.LockDelay)
		res, err := tx.ExecContext(ctx, fill(d.q.leaseAcquire, "{K}", hexLit(r.Name), "{O}", hexLit(r.Owner), "{TTL}", i64(ttl), "{TTLD}", i64(ttld)))
		var id int64
		if err == nil {
			id, err = res.LastInsertId()
		}
		if err != nil {
			_ = tx.Rollback()
			if isDeadlock(err) {
				return nil, &driver.LockedError{}
			}
			return nil, ctxerr.Wrap(ctx, "mysqllock: acquire several", err)
		}
		v := uint64(id)
		if v&lockedFlag != 0 {
			_ = tx.Rollback()
			d.sig.refused(r.Name)
			return nil, &driver.LockedError{RetryAfter: time.Duration(v&^lockedFlag) * time.Microsecond}
		}
		fence, count := v>>countBits, int(v&maxCount)
		if fence == 0 {
			_ = tx.Rollback()
			return nil, fmt.Errorf("mysqllock: acquire several: the server reported no outcome (LAST_INSERT_ID %d)", v)
		}
		gs[i] = driver.Grant{Token: fence, Count: count, TTL: r.TTL}
	}
	if err := tx.Commit(); err != nil {
		return nil, ctxerr.Wrap(ctx, "mysqllock: acquire several", err)
	}
	return gs, nil
}

// inspectKinds lists the kinds' locks whose names start with prefix.
func (d *store) inspectKinds(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	P := hexLit(prefix)
	rows, err := d.db.QueryContext(ctx, fill(d.q.inspectKinds, "{P}", P))
	if err != nil {
		return nil, err
	}
	var ks []sqlcommon.KindRow
	for rows.Next() {
		var k sqlcommon.KindRow
		var name []byte
		if err := rows.Scan(&name, &k.Grp, &k.Fence, &k.Permits, &k.Now); err != nil {
			rows.Close()
			return nil, err
		}
		k.Name = string(name)
		ks = append(ks, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = d.db.QueryContext(ctx, fill(d.q.inspectHolders, "{P}", P))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var hs []sqlcommon.HolderRow
	for rows.Next() {
		var h sqlcommon.HolderRow
		var name, owner []byte
		if err := rows.Scan(&name, &h.Grp, &owner, &h.Kind, &h.Count, &h.Fence, &h.LockUntil, &h.DelayUntil); err != nil {
			return nil, err
		}
		h.Name, h.Owner = string(name), string(owner)
		hs = append(hs, h)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return sqlcommon.KindInfos(ks, hs), nil
}
