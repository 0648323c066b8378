package pglock

import (
	"context"
	"strings"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon"
)

// Read/write locks in ModeAdvisory. PostgreSQL's advisory locks have a
// shared form: a reader holds pg_try_advisory_lock_shared and a writer
// pg_try_advisory_lock on the name's read/write key (RWKey), each on its
// own pinned connection, so the server itself keeps any number of readers
// or one writer, and a reader's or writer's session ending frees its hold.
// The token comes from the name's read/write counter in <table>_kinds,
// incremented in the granting statement only if the lock was granted and
// committed before the grant is reported (as for the mutex), so every
// grant is above every earlier write grant, and a write grant above every
// earlier grant. Writer preference uses the rows of lease mode: a refused
// waiting writer's statement leaves its mark in <table>_holders (expiring
// one TTL later), and a reader's statement tries the shared lock only when
// no other owner's mark is unexpired (read in the statement's snapshot: a
// mark committed during it may be missed once, which only delays the
// preference by one attempt and never affects exclusion). Semaphores are
// not offered in this mode: a stored permit count and its "in use" check
// cannot be expressed with session locks alone.

// RWKey returns the advisory key of name's read/write lock in
// ModeAdvisory: AdvisoryKey of "\x00rw\x00" + name, which no lock name
// (they have no control characters) can share with a mutex.
func RWKey(name string) int64 { return AdvisoryKey("\x00rw\x00" + name) }

// advisoryKindQueries builds the read and write grants of ModeAdvisory;
// before14 for PostgreSQL before 14 (no idle_session_timeout). Both take
// $1 key, $2 name, $3 owner, $4 idle timeout (ms), $5 TTL (µs) and $6
// waiting, and return whether the lock was granted, the token and the
// session's old idle timeout (” when none was armed).
func advisoryKindQueries(table string, before14 bool) (read, write string) {
	set := `s AS MATERIALIZED (
	SELECT current_setting('idle_session_timeout') AS old, set_config('idle_session_timeout', $4, false) AS new
	FROM g WHERE g.ok),`
	if before14 {
		set = `s AS (SELECT ''::text AS old WHERE $4::text IS NULL AND false),`
	}
	bump := `f AS (
	INSERT INTO $T_kinds AS k (name, grp, fence) SELECT $2, 1, 1 FROM g WHERE g.ok
	ON CONFLICT (name, grp) DO UPDATE SET fence = k.fence + 1
	RETURNING fence)`
	result := `SELECT g.ok, COALESCE((SELECT fence FROM f), 0), COALESCE((SELECT old FROM s), '') FROM g`
	r := strings.NewReplacer("$T", table)
	read = r.Replace(`WITH p AS (SELECT $5::bigint AS ttl, $6::bool AS waiting),
m AS MATERIALIZED (
	SELECT EXISTS (SELECT 1 FROM $T_holders WHERE name = $2 AND grp = 1 AND kind = 9 AND owner <> $3
		AND lock_until > ` + nowUS + `) AS marked),
g AS MATERIALIZED (SELECT CASE WHEN m.marked THEN false ELSE pg_try_advisory_lock_shared($1) END AS ok FROM m),
` + set + `
` + bump + `
` + result)
	write = r.Replace(`WITH g AS MATERIALIZED (SELECT pg_try_advisory_lock($1) AS ok),
` + set + `
` + bump + `,
mk AS (
	INSERT INTO $T_holders (name, grp, owner, kind, count, fence, lock_until, delay_until)
	SELECT $2, 1, $3, 9, 1, 0, ` + nowUS + ` + $5, ` + nowUS + ` + $5 FROM g WHERE NOT g.ok AND $6
	ON CONFLICT (name, grp, owner, kind) DO UPDATE SET lock_until = excluded.lock_until, delay_until = excluded.delay_until),
dm AS (DELETE FROM $T_holders WHERE name = $2 AND grp = 1 AND owner = $3 AND kind = 9 AND (SELECT ok FROM g))
` + result)
	return read, write
}

// lockKind is advisory.Lock for a Read or Write request.
func (a advisory) lockKind(ctx context.Context, c *pinned, req driver.AcquireRequest) (bool, uint64, error) {
	q := a.q.advRead
	if req.Kind == driver.Write {
		q = a.q.advWrite
	}
	if a.pgVer < 140000 {
		q = a.q.advRead13
		if req.Kind == driver.Write {
			q = a.q.advWrite13
		}
	}
	var (
		ok    bool
		fence int64
		old   string
	)
	if err := c.QueryRow(ctx, q, c.key, req.Name, req.Owner, c.timeoutMS, sqlcommon.Micros(req.TTL), req.Waiting).
		Scan(&ok, &fence, &old); err != nil {
		return false, 0, err
	}
	c.oldTimeout = old
	return ok, uint64(fence), nil
}

// unlockKind is advisory.Unlock for a Read or Write hold: the shared or
// exclusive unlock, a wake-all NOTIFY if some driver waits for the name
// (see WaitKey) and the session's old idle timeout back, in one statement.
func (a advisory) unlockKind(ctx context.Context, c *pinned, name string) error {
	fn := "pg_advisory_unlock"
	if c.kind == driver.Read {
		fn = "pg_advisory_unlock_shared"
	}
	var (
		notified *bool // false: not held; true: released and notified; nil: released, nobody waits
		err      error
	)
	// As for a mutex (advisoryRelease): the lock is given up before the
	// look for waiters, which NOTIFYs only if some driver marks the name.
	release := `SELECT CASE WHEN NOT ` + fn + `($1) THEN false ELSE ` + notifyIfWaited("$4", "$2", "$3") + ` END`
	if c.oldTimeout != "" {
		err = c.QueryRow(ctx, release+`, set_config('idle_session_timeout', $5, false)`,
			c.key, a.channel, wakeAllPrefix+name, WaitKey(name), c.oldTimeout).Scan(&notified, nil)
	} else {
		err = c.QueryRow(ctx, release, c.key, a.channel, wakeAllPrefix+name, WaitKey(name)).Scan(&notified)
	}
	if err == nil && notified != nil && !*notified {
		err = errNoAdvisoryLock
	}
	return err
}

// heldKinds completes Inspect's held step in ModeAdvisory for the
// read/write locks in out: held while pg_locks shows their RWKey granted,
// with Readers the shared holders.
func heldKinds(out []driver.LockInfo, held []bool, locks map[int64][2]int) {
	for i := range out {
		if out[i].Kind != driver.Write {
			continue
		}
		n := locks[RWKey(out[i].Name)]
		out[i].Readers = n[0]
		held[i] = n[0]+n[1] > 0
	}
}
