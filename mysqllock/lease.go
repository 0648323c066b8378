package mysqllock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// leases is the Locker of ModeLease: one row per name in the lock table,
// expiry decided by the server's UTC_TIMESTAMP(6).
type leases struct {
	*store
	acquireStmt, releaseStmt *prepared
	sig                      *leaseSignals
	watches                  *sqlcommon.Watches // the driver's, set by newDriver
}

var _ sqlcommon.Locker = (*leases)(nil)

func newLeases(st *store) *leases {
	return &leases{store: st, acquireStmt: newPrepared(st.q.leaseAcquire), releaseStmt: newPrepared(st.q.leaseRelease), sig: newLeaseSignals(st)}
}

// TryAcquire implements sqlcommon.Locker: one INSERT … ON DUPLICATE KEY
// UPDATE whose outcome comes back in LAST_INSERT_ID.
func (d *leases) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if req.Kind != driver.Exclusive {
		return d.acquireKind(ctx, req)
	}
	ttl := sqlcommon.Micros(req.TTL)
	ttld := ttl + sqlcommon.Micros(req.LockDelay)
	res, err := d.acquireStmt.exec(ctx, d.db, map[string][2]any{
		"{K}":    {[]byte(req.Name), hexLit(req.Name)},
		"{O}":    {[]byte(req.Owner), hexLit(req.Owner)},
		"{TTL}":  {ttl, strconv.FormatInt(ttl, 10)},
		"{TTLD}": {ttld, strconv.FormatInt(ttld, 10)},
	})
	if err != nil {
		return driver.Grant{}, ctxerr.Wrap(ctx, "mysqllock: acquire", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return driver.Grant{}, ctxerr.Wrap(ctx, "mysqllock: acquire", err)
	}
	v := uint64(id)
	if v&lockedFlag != 0 {
		d.sig.refused(req.Name)
		return driver.Grant{}, &driver.LockedError{RetryAfter: time.Duration(v&^lockedFlag) * time.Microsecond}
	}
	fence, count := v>>countBits, int(v&maxCount)
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: the server reported no outcome (LAST_INSERT_ID %d)", v)
	}
	if count == 1 {
		d.sig.grant(req.Name, req.Owner, d.sig.contended(req.Name, d.watches))
	}
	return driver.Grant{Token: fence, Count: count, TTL: req.TTL}, nil
}

// Release implements sqlcommon.Locker.
func (d *leases) Release(ctx context.Context, l driver.Lease) (int, error) {
	if l.Kind != driver.Exclusive {
		return d.releaseKind(ctx, l)
	}
	res, err := d.releaseStmt.exec(ctx, d.db, map[string][2]any{
		"{K}": {[]byte(l.Name), hexLit(l.Name)},
		"{O}": {[]byte(l.Owner), hexLit(l.Owner)},
		"{F}": {l.Token, strconv.FormatUint(l.Token, 10)},
	})
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release", err)
	}
	if n == 0 {
		awaitSignal(ctx, d.sig.released(l.Name, l.Owner))
		return 0, fmt.Errorf("mysqllock: release: %w", driver.ErrNotHeld)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, ctxerr.Wrap(ctx, "mysqllock: release", err)
	}
	if id == 0 {
		// Waiters wake before this caller can loop back to take the lock
		// again.
		awaitSignal(ctx, d.sig.released(l.Name, l.Owner))
	}
	return int(id), nil
}

// renewBatch bounds the size of one renewal statement: at most about 1.6 MB
// with the longest names and owners, well under max_allowed_packet.
const renewBatch = 2000

type leaseKey struct {
	name, owner string
	fence       uint64
}

// Renew implements sqlcommon.Locker: one UPDATE per 2,000 leases sharing
// a TTL (one statement per tick in the common case).
func (d *leases) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	type group struct {
		ttl, ttld int64
		kinds     bool // read, write or permit leases (the _holders table)
		idx       []int
	}
	var groups []*group
	byKey := map[[3]int64]*group{}
	for i, l := range ls {
		ttl := sqlcommon.Micros(l.TTL)
		var kinds int64
		if l.Kind != driver.Exclusive {
			kinds = 1
		}
		k := [3]int64{ttl, ttl + sqlcommon.Micros(l.LockDelay), kinds}
		g := byKey[k]
		if g == nil {
			g = &group{ttl: k[0], ttld: k[1], kinds: kinds == 1}
			byKey[k] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	errs := make([]error, len(ls))
	first := true
	for _, g := range groups {
		for start := 0; start < len(g.idx); start += renewBatch {
			idx := g.idx[start:min(start+renewBatch, len(g.idx))]
			chunk := d.renewChunk
			if g.kinds {
				chunk = d.renewKindChunk
			}
			if err := chunk(ctx, ls, idx, g.ttl, g.ttld, errs); err != nil {
				if first {
					return nil, err
				}
				for i := range errs {
					if errs[i] == nil {
						errs[i] = err // fate unknown
					}
				}
				return errs, nil
			}
			first = false
		}
	}
	return errs, nil
}

// renewChunk renews ls[idx], which share ttl and ttld (TTL plus lock-delay,
// in µs), and sets errs[i] for those that were not renewed.
func (d *leases) renewChunk(ctx context.Context, ls []driver.Lease, idx []int, ttl, ttld int64, errs []error) error {
	var rows strings.Builder
	distinct := map[leaseKey]bool{}
	for j, i := range idx {
		l := ls[i]
		if j > 0 {
			rows.WriteByte(',')
		}
		fmt.Fprintf(&rows, "(%s,%s,%d)", hexLit(l.Name), hexLit(l.Owner), l.Token)
		distinct[leaseKey{l.Name, l.Owner, l.Token}] = true
	}
	q := fill(d.q.leaseRenew, "{ROWS}", rows.String(), "{TTL}", strconv.FormatInt(ttl, 10), "{TTLD}", strconv.FormatInt(ttld, 10))
	res, err := d.db.ExecContext(ctx, q)
	if err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	if int(n) == len(distinct) {
		return nil // every lease matched and was renewed
	}
	// Some were not renewed: find which are still live. A lease renewed
	// a moment ago with a TTL shorter than this round trip may be reported
	// lost; that errs on the safe side.
	keys := make([]string, 0, len(distinct))
	for k := range distinct {
		keys = append(keys, hexLit(k.name))
	}
	r, err := d.db.QueryContext(ctx, fill(d.q.leaseRenewed, "{KEYS}", strings.Join(keys, ",")))
	if err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	defer r.Close()
	live := map[leaseKey]bool{}
	for r.Next() {
		var (
			name, owner []byte
			fence       uint64
		)
		if err := r.Scan(&name, &owner, &fence); err != nil {
			return ctxerr.Wrap(ctx, "mysqllock: renew", err)
		}
		live[leaseKey{string(name), string(owner), fence}] = true
	}
	if err := r.Err(); err != nil {
		return ctxerr.Wrap(ctx, "mysqllock: renew", err)
	}
	for _, i := range idx {
		if !live[leaseKey{ls[i].Name, ls[i].Owner, ls[i].Token}] {
			d.sig.released(ls[i].Name, ls[i].Owner)
			errs[i] = fmt.Errorf("mysqllock: renew: lease expired or taken over: %w", driver.ErrNotHeld)
		}
	}
	return nil
}

// Close implements sqlcommon.Locker: leases are left to expire; the
// prepared statements are closed.
func (d *leases) Close() {
	d.sig.close()
	d.acquireStmt.close()
	d.releaseStmt.close()
}

// Kill implements sqlcommon.Locker: the signals' connection closes, as a
// crashed process's would.
func (d *leases) Kill() { d.sig.close() }
