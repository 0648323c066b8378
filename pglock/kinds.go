package pglock

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Read/write locks and semaphores (driver.Kinder), in ModeLease only: two
// tables beside the lock table, <table>_kinds and <table>_holders, laid out
// and decided as internal/sqlcommon's kinds.go describes. An acquire is one
// transaction in two round trips: BEGIN, the upsert that locks the lock's
// _kinds row and the read of its holders, pipelined (the read starts after
// the lock is had, so its snapshot sees every holder committed before);
// then the writes sqlcommon.DecideKind asks for and COMMIT, pipelined. A
// release or a renewal is one statement on the holder's row; a renewal
// batch mixing mutexes and kinds is one statement. ModeAdvisory holds
// read/write locks with shared advisory locks (advisory_kinds.go),
// ModeRowLock with shared row locks (rowlock_kinds.go); neither has
// semaphores, which are refused (SupportsKind false: the dlock package
// answers ErrUnsupported).

var (
	_ driver.Kinder        = (*Driver)(nil)
	_ driver.Withdrawer    = (*Driver)(nil)
	_ driver.MultiAcquirer = (*Driver)(nil)
	_ driver.FenceRaiser   = (*Driver)(nil)
)

// wakeAllPrefix leads the NOTIFY payload of a kind's release: every local
// subscriber of the name is woken (several readers may go at once, and
// readers, writers and permit waiters share the name's subscriptions). A
// lock name has no control characters, so it never starts with it.
const wakeAllPrefix = "\x01"

// SupportsKind implements driver.Kinder: in ModeLease every kind; in
// ModeAdvisory and ModeRowLock the mutex and the read/write lock (see
// advisory_kinds.go and rowlock_kinds.go).
func (d *Driver) SupportsKind(k driver.Kind) bool {
	switch d.mode {
	case ModeLease:
		return k <= driver.Permit
	case ModeAdvisory, ModeRowLock:
		return k <= driver.Write
	}
	return k == driver.Exclusive
}

func (d *Driver) unsupported(k driver.Kind) error {
	return fmt.Errorf("pglock: %s locks in mode %s: %w", k, d.mode, driver.ErrUnsupported)
}

// kindTx is one acquire transaction on a pinned pool connection
// (sqlcommon.KindTx).
type kindTx struct {
	st   *store
	conn *pgxpool.Conn
}

func (k *kindTx) Read(ctx context.Context, name string, grp int) (sqlcommon.KindState, []sqlcommon.Holder, error) {
	var st sqlcommon.KindState
	conn, err := k.st.pool.Acquire(ctx)
	if err != nil {
		return st, nil, err
	}
	k.conn = conn
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(k.st.q.kindLock, name, int16(grp))
	b.Queue(k.st.q.kindHolders, name, int16(grp))
	br := conn.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return st, nil, err
	}
	if err := br.QueryRow().Scan(&st.Fence, &st.Permits, &st.Now); err != nil {
		return st, nil, err
	}
	if st.Fence == 0 && st.Permits == 0 {
		// A new row (or one never granted): counted for the table's
		// ANALYZE (see growth).
		k.st.rowAdded(&k.st.grown.kinds)
	}
	rows, err := br.Query()
	if err != nil {
		return st, nil, err
	}
	var hs []sqlcommon.Holder
	for rows.Next() {
		var h sqlcommon.Holder
		var kind int16
		if err := rows.Scan(&h.Owner, &kind, &h.Count, &h.Fence, &h.LockUntil, &h.DelayUntil); err != nil {
			rows.Close()
			return st, nil, err
		}
		h.Kind = int(kind)
		hs = append(hs, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, nil, err
	}
	return st, hs, br.Close()
}

func (k *kindTx) Write(ctx context.Context, name string, grp int, p sqlcommon.KindPlan) error {
	b := &pgx.Batch{}
	if p.SetState {
		b.Queue(k.st.q.kindSet, name, int16(grp), p.Fence, p.Permits)
	}
	if len(p.Delete) > 0 {
		owners := make([]string, len(p.Delete))
		kinds := make([]int16, len(p.Delete))
		for i, h := range p.Delete {
			owners[i], kinds[i] = h.Owner, int16(h.Kind)
		}
		b.Queue(k.st.q.kindDelete, name, int16(grp), owners, kinds)
	}
	if h := p.Put; h != nil {
		b.Queue(k.st.q.kindPut, name, int16(grp), h.Owner, int16(h.Kind), h.Count, h.Fence, h.LockUntil, h.DelayUntil)
	}
	b.Queue("COMMIT")
	if err := k.conn.SendBatch(ctx, b).Close(); err != nil {
		k.Abort()
		return err
	}
	if h := p.Put; h != nil && h.Count == 1 {
		k.st.rowAdded(&k.st.grown.holders) // a new hold (see growth)
	}
	k.conn.Release()
	k.conn = nil
	return nil
}

// Abort rolls back and returns the connection to the pool, or closes it
// when the rollback fails (which ends the transaction on the server).
func (k *kindTx) Abort() {
	if k.conn == nil {
		return
	}
	conn := k.conn
	k.conn = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if conn.Conn().PgConn().IsClosed() {
		conn.Release()
		return
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		_ = conn.Hijack().Close(ctx)
		return
	}
	conn.Release()
}

// acquireKind is TryAcquire of a Read, Write or Permit request.
func (d leases) acquireKind(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return sqlcommon.AcquireKind(ctx, "pglock", &kindTx{st: d.store}, req)
}

// releaseKind is Release of a Read, Write or Permit lease.
func (d leases) releaseKind(ctx context.Context, l driver.Lease) (int, error) {
	var (
		remaining int
		notified  *bool
	)
	err := d.pool.QueryRow(ctx, d.q.kindRelease, l.Name, int16(sqlcommon.Group(l.Kind)), l.Owner, int16(sqlcommon.HolderKind(l.Kind)),
		int64(l.Token), d.channel, wakeAllPrefix+l.Name, WaitKey(l.Name)).Scan(&remaining, &notified)
	if err != nil {
		if isNoRows(err) {
			return 0, fmt.Errorf("pglock: release %s: %w", l.Kind, driver.ErrNotHeld)
		}
		return 0, ctxerr.Wrap(ctx, "pglock: release "+l.Kind.String(), err)
	}
	return remaining, nil
}

// renewArgs are the unnest arrays of the kinds' renewal statement.
func renewArgs(ls []driver.Lease, idx []int) []any {
	n := len(idx)
	names, owners := make([]string, n), make([]string, n)
	grps, kinds := make([]int16, n), make([]int16, n)
	fences, ttls, delays := make([]int64, n), make([]int64, n), make([]int64, n)
	for j, i := range idx {
		l := ls[i]
		names[j], owners[j] = l.Name, l.Owner
		grps[j], kinds[j] = int16(sqlcommon.Group(l.Kind)), int16(sqlcommon.HolderKind(l.Kind))
		fences[j], ttls[j], delays[j] = int64(l.Token), micros(l.TTL), micros(l.LockDelay)
	}
	return []any{names, grps, owners, kinds, fences, ttls, delays}
}

// Withdraw implements driver.Withdrawer: it deletes the mark req.Owner
// left as a waiting writer of req.Name, and wakes the name's waiters (the
// readers it held back).
func (d *Driver) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	if err := d.base.Ready(ctx); err != nil {
		return err
	}
	if !d.SupportsKind(driver.Write) {
		return nil // no marks are ever left
	}
	if _, err := d.pool.Exec(ctx, d.q.withdraw, req.Name, int16(sqlcommon.GroupRW), req.Owner, int16(sqlcommon.KindMark),
		d.channel, wakeAllPrefix+req.Name, WaitKey(req.Name)); err != nil {
		return ctxerr.Wrap(ctx, "pglock: withdraw", err)
	}
	return nil
}

// RaiseFence implements driver.FenceRaiser. For a mutex whose lease is
// live, the holder's token stays as it is (its renewals and release match
// it) and the raise is kept in the row's fence_floor, which the next new
// grant reads; otherwise the counter itself is raised. For a read/write
// lock or a semaphore the counter in its _kinds row is raised (each holder
// keeps its token in its own row). It works in every mode for the mutex.
// In ModeAdvisory, whose tokens are drawn from one sequence per table, the
// raise is the table's: every name's next token is above atLeast.
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if err := d.base.Ready(ctx); err != nil {
		return err
	}
	if atLeast > math.MaxInt64 {
		return fmt.Errorf("pglock: raise fence of %q to %d: above the largest token (2^63-1): %w", name, atLeast, driver.ErrInvalid)
	}
	var err error
	switch {
	case k == driver.Exclusive && d.mode == ModeAdvisory:
		_, err = d.pool.Exec(ctx, d.q.raiseTokens, int64(atLeast), tokenRaiseKey(d.table))
	case k == driver.Exclusive:
		_, err = d.pool.Exec(ctx, d.q.raiseMutex, name, int64(atLeast))
	case d.SupportsKind(k):
		_, err = d.pool.Exec(ctx, d.q.raiseKind, name, int16(sqlcommon.Group(k)), int64(atLeast))
	default:
		return d.unsupported(k)
	}
	if err != nil {
		return ctxerr.Wrap(ctx, "pglock: raise fence", err)
	}
	return nil
}

// TryAcquireMulti implements driver.MultiAcquirer in ModeLease: one
// round trip, a batch that runs in one implicit transaction: each name's
// grant statement (the one TryAcquire runs), in order, then a check that
// the owner now holds every name, which fails (a division by zero) when
// one was refused, rolling the whole batch back. The session modes return
// ErrUnsupported (the dlock package then takes the names one by one).
func (d *Driver) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	if err := d.base.Ready(ctx); err != nil {
		return nil, err
	}
	if d.mode != ModeLease {
		return nil, fmt.Errorf("pglock: several locks in one transaction in mode %s: %w", d.mode, driver.ErrUnsupported)
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	names := make([]string, len(reqs))
	b := &pgx.Batch{}
	for i, r := range reqs {
		if r.Kind != driver.Exclusive || r.Owner != reqs[0].Owner {
			return nil, fmt.Errorf("pglock: several locks at once: only mutexes of one owner: %w", driver.ErrUnsupported)
		}
		names[i] = r.Name
		b.Queue(d.q.leaseAcquire, r.Name, r.Owner, micros(r.TTL), micros(r.LockDelay))
	}
	b.Queue(d.q.multiCheck, names, reqs[0].Owner, len(reqs))
	br := d.pool.SendBatch(ctx, b)
	gs := make([]driver.Grant, len(reqs))
	var locked *driver.LockedError
	var err error
	for i, r := range reqs {
		var (
			won        bool
			fence      int64
			count      int
			retryAfter int64
		)
		err = br.QueryRow().Scan(&won, &fence, &count, &retryAfter)
		if isNoRows(err) {
			won, err = false, nil // created meanwhile by another transaction: held
		}
		if err != nil {
			break
		}
		if !won && locked == nil {
			locked = &driver.LockedError{RetryAfter: time.Duration(retryAfter) * time.Microsecond, Token: uint64(fence)}
		}
		gs[i] = driver.Grant{Token: uint64(fence), Count: count, TTL: r.TTL}
	}
	if err == nil {
		var one int
		err = br.QueryRow().Scan(&one)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case locked != nil && (err == nil || pgCode(err) == "22012"):
		return nil, locked
	case err != nil && (pgCode(err) == "40P01" || pgCode(err) == "22012"):
		// A deadlock (or a refusal the first rows did not show): the
		// batch was rolled back, nothing is held.
		return nil, &driver.LockedError{}
	case err != nil:
		return nil, ctxerr.Wrap(ctx, "pglock: acquire several", err)
	}
	return sqlcommon.SetKeys(d.table, reqs, gs), nil
}

// inspectKinds lists the kinds' locks whose names start with prefix.
func (d *store) inspectKinds(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	rows, err := d.pool.Query(ctx, d.q.inspectKinds, prefix)
	if err != nil {
		return nil, err
	}
	ks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sqlcommon.KindRow, error) {
		var k sqlcommon.KindRow
		var grp int16
		err := r.Scan(&k.Name, &grp, &k.Fence, &k.Permits, &k.Now)
		k.Grp = int(grp)
		return k, err
	})
	if err != nil {
		return nil, err
	}
	rows, err = d.pool.Query(ctx, d.q.inspectHolder, prefix)
	if err != nil {
		return nil, err
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sqlcommon.HolderRow, error) {
		var h sqlcommon.HolderRow
		var grp, kind int16
		err := r.Scan(&h.Name, &grp, &h.Owner, &kind, &h.Count, &h.Fence, &h.LockUntil, &h.DelayUntil)
		h.Grp, h.Kind = int(grp), int(kind)
		return h, err
	})
	if err != nil {
		return nil, err
	}
	return sqlcommon.KindInfos(ks, hs), nil
}
