package pglock

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// queries holds the SQL text for one table name. The name has been checked
// by sqlcommon.CheckTable, so splicing it in is safe.
type queries struct {
	createTable, createRowTable string

	leaseTake, leaseAcquire, leaseRelease, leaseRenew string

	advisoryAcquire, advisoryAcquire13, advisoryRelease, advisoryReleaseReset, advisoryPing string
	// advisoryAcquireNew and advisoryAcquireNew13 are advisoryAcquire and
	// advisoryAcquire13 that also create the name's row if it is missing.
	advisoryAcquireNew, advisoryAcquireNew13 string
	// advisoryBlock and advisoryBlock13 wait for the lock (advisory.Block);
	// advisoryEnsure makes sure of a name's row before the first of them.
	advisoryBlock, advisoryBlock13, advisoryEnsure, advisoryUnlockLeft    string
	advisoryPingMarked, advisoryPingMarked13                              string
	createTokens, createTokenFloor, hasTokens, migrateTokens, raiseTokens string

	rowEnsure, rowLock, rowLockWait, fenceBump, rowPing, rowNotify string

	inspect, inspectAdvisory, inspectRow string

	// The kinds (see kinds.go) and fence raising.
	createKinds, createHolders, hasFloor, addFloor                 string
	kindLock, kindHolders, kindSet, kindDelete, kindPut            string
	kindRelease, kindRenew, mixedRenew, withdraw                   string
	raiseMutex, raiseKind, multiCheck, inspectKinds, inspectHolder string
	advRead, advWrite, advRead13, advWrite13                       string
	inspectAdvisoryModes                                           string
	rowKinds                                                       rowKindQueries
	inspectRowWriters                                              string
}

// nowUS is the server's clock in microseconds since the epoch, the unit
// of the kinds' tables: clock_timestamp(), not now(), so that a statement
// that waited for a row lock reads the time after the wait.
const nowUS = `(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`

// fillFactor is the fill factor of the tables whose rows are rewritten in
// place: the lock table, <table>_kinds and <table>_holders. Every grant,
// renewal and release writes a new version of its row; PostgreSQL keeps
// that update HOT (no new index entry, the old version pruned within the
// page) only when the row's page has room for the new version. Packed full
// (the default, 100), a renewal of many leases moves each row to another
// page with a new index entry, so the table and its index grow with every
// renewal tick until vacuum runs, and every lookup on them slows down. At
// 50 each page keeps room for a new version of every row on it.
const fillFactor = "50"

func newQueries(table string) queries {
	r := strings.NewReplacer("$T", table)
	var q queries
	q.createTable = r.Replace(`CREATE TABLE IF NOT EXISTS $T (
	name        text PRIMARY KEY,
	owner       text NOT NULL DEFAULT '',
	count       integer NOT NULL DEFAULT 0,
	fence       bigint NOT NULL DEFAULT 0,
	lock_until  timestamptz NOT NULL DEFAULT '-infinity',
	delay_until timestamptz NOT NULL DEFAULT '-infinity',
	version     bigint NOT NULL DEFAULT 0,
	fence_floor bigint NOT NULL DEFAULT 0
) WITH (fillfactor = ` + fillFactor + `)`)
	q.createRowTable = r.Replace(`CREATE TABLE IF NOT EXISTS $T_rowlock (name text PRIMARY KEY)`)

	// One statement decides and grants with the server's clock. A row is
	// free when its lock-delay deadline has passed (a release sets both
	// deadlines to now()); it is ours when our owner holds an unexpired
	// grant. Otherwise the conflict WHERE is false, nothing is written, and
	// the second branch reports how long until the row frees.
	q.leaseAcquire = r.Replace(`WITH up AS (
	INSERT INTO $T AS l (name, owner, count, fence, lock_until, delay_until, version)
	VALUES ($1, $2, 1, 1, now() + $3 * interval '1 microsecond', now() + ($3 + $4) * interval '1 microsecond', 1)
	ON CONFLICT (name) DO UPDATE SET
		count = CASE WHEN l.delay_until <= now() THEN 1 ELSE l.count + 1 END,
		fence = CASE WHEN l.delay_until <= now() THEN GREATEST(l.fence, l.fence_floor) + 1 ELSE l.fence END,
		owner = excluded.owner,
		lock_until = excluded.lock_until,
		delay_until = excluded.delay_until,
		version = l.version + 1
	WHERE l.delay_until <= now() OR (l.lock_until > now() AND l.owner = excluded.owner)
	RETURNING fence, count)
SELECT true, fence, count, 0::bigint FROM up
UNION ALL
SELECT false, fence, count, GREATEST(0, (extract(epoch FROM delay_until - now()) * 1e6)::bigint)
FROM $T WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM up)`)

	// The common case, the name's row exists, is tried first with a plain
	// UPDATE of the same decision: no speculative-insert path, no tuple
	// lock before the update, no second branch (about a tenth less server
	// time per Lock+Unlock than leaseAcquire). It returns no row when the
	// row is missing or not free; leaseAcquire then decides.
	q.leaseTake = r.Replace(`UPDATE $T AS l SET
	count = CASE WHEN l.delay_until <= now() THEN 1 ELSE l.count + 1 END,
	fence = CASE WHEN l.delay_until <= now() THEN GREATEST(l.fence, l.fence_floor) + 1 ELSE l.fence END,
	owner = $2,
	lock_until = now() + $3 * interval '1 microsecond',
	delay_until = now() + ($3 + $4) * interval '1 microsecond',
	version = l.version + 1
WHERE l.name = $1 AND (l.delay_until <= now() OR (l.lock_until > now() AND l.owner = $2))
RETURNING fence, count`)

	q.leaseRelease = r.Replace(`WITH r AS (
	UPDATE $T SET
		count = count - 1,
		owner = CASE WHEN count > 1 THEN owner ELSE '' END,
		lock_until = CASE WHEN count > 1 THEN lock_until ELSE now() END,
		delay_until = CASE WHEN count > 1 THEN delay_until ELSE now() END,
		version = version + 1
	WHERE name = $1 AND owner = $2 AND fence = $3 AND count > 0 AND lock_until > now()
	RETURNING count)
SELECT count, CASE WHEN count = 0 THEN ` + notifyIfWaited("$5", "$4", "$1") + ` END FROM r WHERE ` + asyncCommit)

	q.leaseRenew = r.Replace(`UPDATE $T AS l SET
	lock_until = now() + x.ttl * interval '1 microsecond',
	delay_until = now() + (x.ttl + x.delay) * interval '1 microsecond',
	version = l.version + 1
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) AS x(name, owner, fence, ttl, delay)
WHERE l.name = x.name AND l.owner = x.owner AND l.fence = x.fence AND l.count > 0 AND l.lock_until > now()
RETURNING l.name, l.owner, l.fence`)

	// One statement: the advisory lock is tried first (an InitPlan, run
	// once, before anything else); only if it was granted does the SELECT
	// yield its row, whose token is the next value of the table's token
	// sequence plus the current value of its floor sequence (see
	// tokenSeq), and whose txid_current() gives the transaction an ID, so
	// that its commit flushes the WAL up to it, covering the sequence
	// state the token was drawn from, before the grant is reported. Nothing
	// in a table is written: a sequence draw costs a fraction of a row
	// update (see docs/performance.md). No row back means the lock is
	// held elsewhere. The session's idle timeout is read and armed in the
	// same statement, only when granted.
	acquire := `SELECT nextval('$T_tokens') + (SELECT last_value FROM $T_token_floor), txid_current(), `
	grantedOnly := ` WHERE (SELECT pg_try_advisory_lock($1))`
	q.advisoryAcquire = r.Replace(acquire + `current_setting('idle_session_timeout'), set_config('idle_session_timeout', $2, false)` + grantedOnly)
	// Before PostgreSQL 14 there is no idle_session_timeout.
	q.advisoryAcquire13 = r.Replace(acquire + `'', ''` + grantedOnly)
	// The first acquire of a name by a driver also makes sure its row
	// exists (a no-op when it does), so that Inspect lists it: the CTE runs
	// whether or not the lock is granted. The name is the last parameter.
	// insertName makes sure of a name's row, the name being parameter $n.
	insertName := func(n string) string {
		return r.Replace(`INSERT INTO $T (name) VALUES ($` + n + `) ON CONFLICT (name) DO NOTHING`)
	}
	newRow := func(n string) string { return `WITH n AS (` + insertName(n) + `) ` }
	// The waiting acquire (see advisory.Block): the same statement with
	// pg_advisory_lock, which waits at most lock_timeout (the last
	// parameter, ms, set for this statement's transaction only, before the
	// lock is asked for: the subqueries hold volatile functions, so the
	// planner keeps them nested and runs the inner one first).
	blocking := func(timeout string) string {
		return ` FROM (SELECT pg_advisory_lock($1) FROM (SELECT set_config('lock_timeout', $` + timeout + `, true)) AS t) AS l`
	}
	q.advisoryBlock = r.Replace(acquire + `current_setting('idle_session_timeout'), set_config('idle_session_timeout', $2, false)` + blocking("3"))
	q.advisoryBlock13 = r.Replace(acquire + `'', ''` + blocking("2"))
	q.advisoryEnsure = insertName("1")
	// A waiting turn that failed may still have been granted the lock (see
	// advisory.Block): give it up if this session holds it, without the
	// WARNING pg_advisory_unlock raises for a lock not held.
	q.advisoryUnlockLeft = `SELECT pg_advisory_unlock($1) FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1`
	q.advisoryAcquireNew = newRow("3") + q.advisoryAcquire
	q.advisoryAcquireNew13 = newRow("2") + q.advisoryAcquire13
	q.createTokens = r.Replace(`CREATE SEQUENCE IF NOT EXISTS $T_tokens MINVALUE 1`)
	q.createTokenFloor = r.Replace(`CREATE SEQUENCE IF NOT EXISTS $T_token_floor MINVALUE 0 START 0`)
	q.hasTokens = r.Replace(`SELECT to_regclass('$T_tokens') IS NOT NULL`)
	// A raise of the floor: under a transaction-scoped advisory lock that
	// serialises raisers (grants never write the floor), the floor becomes
	// large enough that the next draw, which is above the token sequence's
	// last value (or is that value, before its first draw), gives a token
	// above $1. Sequences are read as they
	// are now, not through the statement's snapshot, and setval is never
	// rolled back.
	q.raiseTokens = r.Replace(`SELECT setval('$T_token_floor', GREATEST((SELECT last_value FROM $T_token_floor), $1 - (SELECT last_value - (NOT is_called)::int FROM $T_tokens)))
FROM (SELECT pg_advisory_xact_lock($2)) AS serialised`)
	// A table whose names were fenced per row (before the token
	// sequence) has its floor raised above every token it handed out.
	q.migrateTokens = r.Replace(`SELECT setval('$T_token_floor', GREATEST((SELECT last_value FROM $T_token_floor), (SELECT COALESCE(max(GREATEST(fence, fence_floor)), 0) FROM $T)))
FROM (SELECT pg_advisory_xact_lock($1)) AS serialised`)
	// One column: false when the session held no such lock, else true if
	// it notified and NULL if nobody waits. The CASE gives the lock up
	// before it looks for waiters, so a waiter that marks itself after
	// the look tries the lock after the unlock.
	q.advisoryRelease = `SELECT CASE WHEN NOT pg_advisory_unlock($1) THEN false ELSE ` + notifyIfWaited("$4", "$2", "$3") + ` END`
	q.advisoryReleaseReset = q.advisoryRelease + `, set_config('idle_session_timeout', $5, false)`
	// Acquire arms a server-side idle timeout of one TTL and every renewal
	// ping re-arms it, so a holder that stops renewing (crashed without a
	// FIN, paused, cut off) loses its session, and the lock, about one TTL
	// after its last renewal. Release restores the session's old value.
	q.advisoryPing = `SELECT set_config('idle_session_timeout', $1, false)`
	// A mutex holder's ping also names its hold, as a literal that the
	// simple protocol puts in the statement's text, which other sessions
	// read in pg_stat_activity.query (see holdMarker).
	q.advisoryPingMarked = `SELECT set_config('idle_session_timeout', $1, false), $2::text`
	q.advisoryPingMarked13 = `SELECT $1::text`

	q.rowEnsure = r.Replace(`INSERT INTO $T_rowlock (name) VALUES ($1) ON CONFLICT DO NOTHING`)
	q.rowLockWait = r.Replace(`SELECT set_config('idle_in_transaction_session_timeout', $2, true) FROM $T_rowlock WHERE name = $1 FOR UPDATE`)
	q.rowLock = q.rowLockWait + ` NOWAIT`
	q.fenceBump = r.Replace(`INSERT INTO $T AS l (name, owner, fence) VALUES ($1, $2, 1)
	ON CONFLICT (name) DO UPDATE SET fence = GREATEST(l.fence, l.fence_floor) + 1, owner = excluded.owner, version = l.version + 1
	RETURNING fence`)
	q.rowPing = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`
	// Sent in the transaction that holds the row, just before its COMMIT,
	// which ends the row lock and the try's lock on the wait key together.
	q.rowNotify = `SELECT ` + notifyIfWaited("$3", "$1", "$2")

	// A lock is held, for status, until it can be taken: to the end of its
	// lease, or of its lock-delay once the lease ran out unreleased.
	q.inspect = r.Replace(`SELECT name, owner, fence, count,
	CASE WHEN count > 0 AND GREATEST(lock_until, delay_until) > now() THEN (extract(epoch FROM GREATEST(lock_until, delay_until) - now()) * 1e6)::bigint ELSE 0 END
FROM $T WHERE left(name, char_length($1)) = $1 ORDER BY name`)
	q.inspectAdvisory = `SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 1 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
	q.inspectRow = r.Replace(`SELECT name FROM $T_rowlock WHERE left(name, char_length($1)) = $1 FOR KEY SHARE SKIP LOCKED`)
	q.rowKinds = newRowKindQueries(table)
	// Rows a writer holds FOR UPDATE: FOR SHARE SKIP LOCKED skips them and
	// not those readers hold FOR SHARE (so readers are not seen).
	q.inspectRowWriters = r.Replace(`SELECT name FROM $T_rowlock WHERE name = ANY($1) FOR SHARE SKIP LOCKED`)
	q.advRead, q.advWrite = advisoryKindQueries(table, false)
	q.advRead13, q.advWrite13 = advisoryKindQueries(table, true)
	// With each advisory key granted or waited for, the text of the last
	// statement its session ran: a mutex holder's renewal ping names the
	// hold (see holdMarker). A key not granted is a waiter blocked in
	// pg_advisory_lock (advisory.Block).
	q.inspectAdvisoryModes = `SELECT (l.classid::bigint << 32) | l.objid::bigint, l.mode = 'ShareLock', l.granted, COALESCE(a.query, '')
FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`
	q.hasFloor = `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'fence_floor' AND NOT attisdropped)`
	q.addFloor = r.Replace(`ALTER TABLE $T ADD COLUMN IF NOT EXISTS fence_floor bigint NOT NULL DEFAULT 0`)
	q.createKinds = r.Replace(`CREATE TABLE IF NOT EXISTS $T_kinds (
	name    text NOT NULL,
	grp     smallint NOT NULL,
	fence   bigint NOT NULL DEFAULT 0,
	permits integer NOT NULL DEFAULT 0,
	PRIMARY KEY (name, grp)
) WITH (fillfactor = ` + fillFactor + `)`)
	q.createHolders = r.Replace(`CREATE TABLE IF NOT EXISTS $T_holders (
	name        text NOT NULL,
	grp         smallint NOT NULL,
	owner       text NOT NULL,
	kind        smallint NOT NULL,
	count       integer NOT NULL,
	fence       bigint NOT NULL,
	lock_until  bigint NOT NULL,
	delay_until bigint NOT NULL,
	PRIMARY KEY (name, grp, owner, kind)
) WITH (fillfactor = ` + fillFactor + `)`)
	q.kindLock = r.Replace(`INSERT INTO $T_kinds AS k (name, grp) VALUES ($1, $2)
ON CONFLICT (name, grp) DO UPDATE SET fence = k.fence
RETURNING fence, permits, ` + nowUS)
	q.kindHolders = r.Replace(`SELECT owner, kind, count, fence, lock_until, delay_until FROM $T_holders WHERE name = $1 AND grp = $2`)
	q.kindSet = r.Replace(`UPDATE $T_kinds SET fence = $3, permits = $4 WHERE name = $1 AND grp = $2`)
	q.kindDelete = r.Replace(`DELETE FROM $T_holders AS h USING unnest($3::text[], $4::smallint[]) AS x(owner, kind)
WHERE h.name = $1 AND h.grp = $2 AND h.owner = x.owner AND h.kind = x.kind`)
	q.kindPut = r.Replace(`INSERT INTO $T_holders (name, grp, owner, kind, count, fence, lock_until, delay_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (name, grp, owner, kind) DO UPDATE SET count = excluded.count, fence = excluded.fence,
	lock_until = excluded.lock_until, delay_until = excluded.delay_until`)
	// The last hold's release deletes the row (its place is free at once,
	// with no lock-delay) and NOTIFYs if some driver waits for the name
	// (see notifyIfWaited); an earlier one counts down.
	holder := `name = $1 AND grp = $2 AND owner = $3 AND kind = $4 AND ($5 = 0 OR fence = $5) AND lock_until > ` + nowUS
	q.kindRelease = r.Replace(`WITH d AS (DELETE FROM $T_holders WHERE ` + holder + ` AND count <= 1 RETURNING 0 AS count),
u AS (UPDATE $T_holders SET count = count - 1 WHERE ` + holder + ` AND count > 1 RETURNING count),
r AS (SELECT count FROM d UNION ALL SELECT count FROM u)
SELECT count, CASE WHEN count = 0 THEN ` + notifyIfWaited("$8", "$6", "$7") + ` END FROM r WHERE ` + asyncCommit)
	kindRenew := `UPDATE $T_holders AS h SET lock_until = ` + nowUS + ` + x.ttl, delay_until = ` + nowUS + ` + x.ttl + x.delay
FROM unnest($N1::text[], $N2::smallint[], $N3::text[], $N4::smallint[], $N5::bigint[], $N6::bigint[], $N7::bigint[]) AS x(name, grp, owner, kind, fence, ttl, delay)
WHERE h.name = x.name AND h.grp = x.grp AND h.owner = x.owner AND h.kind = x.kind AND h.fence = x.fence AND h.lock_until > ` + nowUS + `
RETURNING h.name, h.owner, h.kind::int, h.fence`
	q.kindRenew = r.Replace(strings.NewReplacer("$N1", "$1", "$N2", "$2", "$N3", "$3", "$N4", "$4", "$N5", "$5", "$N6", "$6", "$N7", "$7").Replace(kindRenew))
	// A renewal mixing mutexes and kinds is one statement: the mutexes'
	// UPDATE (leaseRenew, $1-$5) and the holders' ($6-$12).
	q.mixedRenew = `WITH a AS (` + q.leaseRenew + `), b AS (` +
		r.Replace(strings.NewReplacer("$N1", "$6", "$N2", "$7", "$N3", "$8", "$N4", "$9", "$N5", "$10", "$N6", "$11", "$N7", "$12").Replace(kindRenew)) + `)
SELECT name, owner, 0, fence FROM a UNION ALL SELECT * FROM b`
	q.withdraw = r.Replace(`WITH d AS (DELETE FROM $T_holders WHERE name = $1 AND grp = $2 AND owner = $3 AND kind = $4 RETURNING 1)
SELECT ` + notifyIfWaited("$7", "$5", "$6") + ` FROM d LIMIT 1`)
	// A held mutex keeps its token (its renewals and release match it):
	// the raise waits in fence_floor, which the next new grant reads.
	q.raiseMutex = r.Replace(`INSERT INTO $T AS l (name, fence) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET
	fence = CASE WHEN l.count > 0 AND l.lock_until > now() THEN l.fence ELSE GREATEST(l.fence, excluded.fence) END,
	fence_floor = CASE WHEN l.count > 0 AND l.lock_until > now() THEN GREATEST(l.fence_floor, excluded.fence) ELSE l.fence_floor END,
	version = l.version + 1`)
	q.raiseKind = r.Replace(`INSERT INTO $T_kinds AS k (name, grp, fence) VALUES ($1, $2, $3)
ON CONFLICT (name, grp) DO UPDATE SET fence = GREATEST(k.fence, excluded.fence)`)
	// The last statement of a multi-acquire batch: a division by zero,
	// which rolls the whole batch (one implicit transaction) back, unless
	// the owner now holds every name. now() is the transaction's start,
	// from which every grant of the batch counted its lease.
	q.multiCheck = r.Replace(`SELECT 1 / (count(*) = $3)::int FROM $T WHERE name = ANY($1) AND owner = $2 AND count > 0 AND lock_until > now()`)
	q.inspectKinds = r.Replace(`SELECT name, grp, fence, permits, ` + nowUS + ` FROM $T_kinds WHERE left(name, char_length($1)) = $1`)
	q.inspectHolder = r.Replace(`SELECT name, grp, owner, kind, count, fence, lock_until, delay_until FROM $T_holders WHERE left(name, char_length($1)) = $1`)
	return q
}

// asyncCommit is a condition, always true, that makes the statement's
// transaction commit without waiting for its WAL to be flushed (or
// replicated to a synchronous standby): synchronous_commit = off for this
// transaction only. The releases use it. A release lost in a server crash
// or failover leaves the lock held, as it was, until its lease ends: a
// later holder waits, none is granted twice, and no token is reissued (the
// fence moves only in grants, whose commits stay synchronous). A grant
// that saw the release commits after it, and its synchronous commit flushes
// the WAL up to and including the release. So a Lock+Unlock in ModeLease
// waits for one WAL flush, the grant's, instead of two. The setting covers
// the whole transaction: a statement using it must never share one (a
// pgx.Batch, an explicit transaction) with a grant or a fence increment.
const asyncCommit = `set_config('synchronous_commit', 'off', true) = 'off'`

// notifyIfWaited is an expression that NOTIFYs channel with payload only
// when the lock's WaitKey (the parameter waitKey) is marked by some
// driver's LISTEN session (see listener): the exclusive try fails against
// a mark. The try's lock lasts to the end of the transaction, which must
// already have given the lock up (or give it up at its commit), so that a
// waiter marking itself meanwhile waits for the commit and then finds the
// lock free. It yields true when it notified, NULL when nobody waits.
func notifyIfWaited(waitKey, channel, payload string) string {
	return `CASE WHEN pg_try_advisory_xact_lock(` + waitKey + `) THEN NULL ELSE (SELECT true FROM pg_notify(` + channel + `, ` + payload + `)) END`
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func isUniqueViolation(err error) bool { return pgCode(err) == "23505" }

// isLockNotAvailable reports NOWAIT's "could not obtain lock on row".
func isLockNotAvailable(err error) bool { return pgCode(err) == "55P03" }

// isQueryCanceled reports a statement the server cancelled
// (statement_timeout, pg_cancel_backend, a cancel request).
func isQueryCanceled(err error) bool { return pgCode(err) == "57014" }
