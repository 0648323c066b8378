package mysqllock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

func (d *Driver) leaseAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	ttl := sqlcommon.Micros(req.TTL)
	q := fill(d.q.leaseAcquire,
		"{K}", hexLit(req.Name), "{O}", hexLit(req.Owner),
		"{TTL}", strconv.FormatInt(ttl, 10), "{TTLD}", strconv.FormatInt(ttl+sqlcommon.Micros(req.LockDelay), 10))
	res, err := d.db.ExecContext(ctx, q)
	if err != nil {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: %w", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: %w", err)
	}
	v := uint64(id)
	if v&lockedFlag != 0 {
		return driver.Grant{}, &driver.LockedError{RetryAfter: time.Duration(v&^lockedFlag) * time.Microsecond}
	}
	fence, count := v>>countBits, int(v&maxCount)
	if fence == 0 {
		return driver.Grant{}, fmt.Errorf("mysqllock: acquire: the server reported no outcome (LAST_INSERT_ID %d)", v)
	}
	return driver.Grant{Token: fence, Count: count, TTL: req.TTL}, nil
}

func (d *Driver) leaseRelease(ctx context.Context, l driver.Lease) (int, error) {
	q := fill(d.q.leaseRelease, "{K}", hexLit(l.Name), "{O}", hexLit(l.Owner), "{F}", strconv.FormatUint(l.Token, 10))
	res, err := d.db.ExecContext(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("mysqllock: release: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("mysqllock: release: %w", err)
	}
	if n == 0 {
		return 0, fmt.Errorf("mysqllock: release: %w", driver.ErrNotHeld)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("mysqllock: release: %w", err)
	}
	return int(id), nil
}

// renewBatch bounds the size of one renewal statement.
const renewBatch = 500

type leaseKey struct {
	name  string
	fence uint64
}

func (d *Driver) leaseRenew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	errs := make([]error, len(ls))
	for start := 0; start < len(ls); start += renewBatch {
		end := min(start+renewBatch, len(ls))
		if err := d.renewChunk(ctx, ls[start:end], errs[start:end]); err != nil {
			if start == 0 {
				return nil, err
			}
			for i := start; i < len(ls); i++ {
				errs[i] = err
			}
			break
		}
	}
	return errs, nil
}

func (d *Driver) renewChunk(ctx context.Context, ls []driver.Lease, errs []error) error {
	var rows strings.Builder
	distinct := map[leaseKey]bool{}
	for i, l := range ls {
		if i > 0 {
			rows.WriteString(" UNION ALL ")
		}
		fmt.Fprintf(&rows, "SELECT %s AS n, %s AS o, %d AS f, %d AS t, %d AS d",
			hexLit(l.Name), hexLit(l.Owner), l.Token, sqlcommon.Micros(l.TTL), sqlcommon.Micros(l.LockDelay))
		distinct[leaseKey{l.Name, l.Token}] = true
	}
	res, err := d.db.ExecContext(ctx, fill(d.q.leaseRenew, "{ROWS}", rows.String()))
	if err != nil {
		return fmt.Errorf("mysqllock: renew: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("mysqllock: renew: %w", err)
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
		return fmt.Errorf("mysqllock: renew: %w", err)
	}
	defer r.Close()
	live := map[leaseKey]bool{}
	for r.Next() {
		var (
			name  []byte
			fence uint64
		)
		if err := r.Scan(&name, &fence); err != nil {
			return fmt.Errorf("mysqllock: renew: %w", err)
		}
		live[leaseKey{string(name), fence}] = true
	}
	if err := r.Err(); err != nil {
		return fmt.Errorf("mysqllock: renew: %w", err)
	}
	for i, l := range ls {
		if !live[leaseKey{l.Name, l.Token}] {
			errs[i] = fmt.Errorf("mysqllock: renew: lease expired or taken over: %w", driver.ErrNotHeld)
		}
	}
	return nil
}
