package sqlitelock

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/dlock/dlock/driver"
)

type renewItem struct {
	name, owner string
	fence       int64
}

// renewSizes are the batch sizes Renew prepares statements for. A batch is
// cut into chunks of the largest size, and the last chunk is padded up to
// the next size by repeating its last lease (an UPDATE … FROM matches each
// row once, so a repeat changes nothing). Five prepared statements then
// serve every batch size; padding at most quadruples the rows of a small
// batch, and adds under 256 to a large one.
var renewSizes = []int{1, 4, 16, 64, 256}

// renewStmt returns the prepared renewal statement for k leases.
func (d *Driver) renewStmt(ctx context.Context, k int) (*sql.Stmt, error) {
	d.renewMu.Lock()
	defer d.renewMu.Unlock()
	if st := d.renewStmts[k]; st != nil {
		return st, nil
	}
	if d.closed.Load() {
		return nil, errClosed
	}
	t := d.table
	vals := strings.TrimSuffix(strings.Repeat("(?,?,?,?,?),", k), ",")
	st, err := d.db.PrepareContext(ctx, `WITH b(name, owner, fence, ttl, delay) AS (VALUES `+vals+`)
UPDATE `+t+` SET
	updated_at = n.now,
	lock_until = n.now + b.ttl,
	delay_until = n.now + b.ttl + b.delay
FROM (SELECT `+nowMS+` AS now) AS n, b
WHERE `+t+`.name = b.name AND `+t+`.owner = b.owner AND `+t+`.fence = b.fence
	AND `+t+`.count > 0 AND n.now < `+t+`.lock_until
RETURNING name, owner, fence`)
	if err != nil {
		return nil, err
	}
	d.renewStmts[k] = st
	return st, nil
}

func hasKinds(ls []driver.Lease) bool {
	for _, l := range ls {
		if l.Kind != driver.Exclusive {
			return true
		}
	}
	return false
}

// Renew extends every lease in ls to its TTL from now, by SQLite's clock,
// in one transaction (one statement per 256 leases). A lease whose row no
// longer has its owner and token, or whose lease has already expired, gets
// an error wrapping driver.ErrNotHeld: an expired lease is never revived.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if d.closed.Load() {
		return nil, errClosed
	}
	errs := make([]error, len(ls))
	if len(ls) == 0 {
		return errs, nil
	}
	// The kinds' leases (rows of the _holders table) are renewed in the
	// same transaction, one statement each.
	all := ls
	var kinds []int
	if hasKinds(ls) {
		ls = make([]driver.Lease, 0, len(all))
		for i, l := range all {
			if l.Kind == driver.Exclusive {
				ls = append(ls, l)
			} else {
				kinds = append(kinds, i)
			}
		}
	}
	kindRenewed := make(map[int]bool, len(kinds))
	args := make([]any, 0, 5*min(len(ls), renewSizes[len(renewSizes)-1]))
	renewed := make(map[renewItem]bool, len(ls))
	// Prepare every statement the batch needs before a transaction takes
	// the connection (Open's pool has only one).
	big := renewSizes[len(renewSizes)-1]
	type part struct {
		ls   []driver.Lease
		size int
		st   *sql.Stmt
	}
	var parts []part
	for start := 0; start < len(ls); start += big {
		p := part{ls: ls[start:min(start+big, len(ls))], size: big}
		for _, s := range renewSizes {
			if s >= len(p.ls) {
				p.size = s
				break
			}
		}
		var err error
		if p.st, err = d.renewStmt(ctx, p.size); err != nil {
			return nil, d.wrap(ctx, "renew", err)
		}
		parts = append(parts, p)
	}
	chunk := func(ctx context.Context, tx *sql.Tx, p part) error {
		st, part, size := p.st, p.ls, p.size
		if tx != nil {
			st = tx.StmtContext(ctx, st)
			defer st.Close()
		}
		args = args[:0]
		for i := 0; i < size; i++ {
			l := part[min(i, len(part)-1)]
			args = append(args, l.Name, l.Owner, int64(l.Token), max(ms(l.TTL), 1), ms(l.LockDelay))
		}
		rows, err := st.QueryContext(ctx, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var it renewItem
			if err := rows.Scan(&it.name, &it.owner, &it.fence); err != nil {
				return err
			}
			renewed[it] = true
		}
		return rows.Err()
	}
	err := d.retryBusy(ctx, func() error {
		clear(renewed)
		clear(kindRenewed)
		if len(parts) == 1 && len(kinds) == 0 {
			return chunk(ctx, nil, parts[0])
		}
		if len(parts) == 0 && len(kinds) == 1 {
			return d.renewKinds(ctx, nil, all, kinds, kindRenewed)
		}
		tx, err := d.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if err := chunk(ctx, tx, p); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := d.renewKinds(ctx, tx, all, kinds, kindRenewed); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	})
	if err != nil {
		return nil, d.wrap(ctx, "renew", err)
	}
	for i, l := range all {
		if l.Kind != driver.Exclusive {
			if !kindRenewed[i] {
				d.sig.releasedKey(kindKey(l.Name, l.Kind, l.Owner), l.Name, l.Owner)
				errs[i] = fmt.Errorf("sqlitelock: renew %s %q: %w", l.Kind, l.Name, driver.ErrNotHeld)
			}
			continue
		}
		if !renewed[renewItem{l.Name, l.Owner, int64(l.Token)}] {
			d.sig.released(l.Name, l.Owner)
			errs[i] = fmt.Errorf("sqlitelock: renew %q: %w", l.Name, driver.ErrNotHeld)
		}
	}
	return errs, nil
}
