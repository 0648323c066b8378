package mysqllock

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// Most statements are sent as text with their values spliced in as
// literals: strings as hex literals (X'…', which cannot break out of the
// literal and compare byte for byte with the VARBINARY columns), numbers
// formatted by strconv. That keeps each operation to one round trip whatever
// the caller's DSN says about interpolateParams, with no prepared statements
// to track on pinned connections. The two long lease statements are
// server-side prepared instead (see prepared), with the same placeholders.
// The table name has been checked by sqlcommon.CheckTable.

func hexLit(s string) string { return "X'" + hex.EncodeToString([]byte(s)) + "'" }

// fill replaces {key} placeholders in tmpl.
func fill(tmpl string, kv ...string) string {
	return strings.NewReplacer(kv...).Replace(tmpl)
}

// Encoding of the acquire statement's outcome in LAST_INSERT_ID: a grant is
// fence<<countBits | count (fence < 2^43; the count is reported modulo
// 2^20, which only matters past a million nested holds); a refusal is
// lockedFlag + microseconds until the row frees.
const (
	countBits  = 20
	maxCount   = 1<<countBits - 1
	lockedFlag = uint64(1) << 63
)

type queries struct {
	createTable, createRowTable string

	leaseAcquire, leaseRelease, leaseRenew, leaseRenewed string

	getLock, getLockWait, fenceInsert, getLockRelease string

	rowLock, rowLockWait, rowEnsure, fenceBump, rowConfirm, rowRelease string

	signalWait string

	ping, inspect, inspectRow string

	// The kinds (see kinds.go) and fence raising.
	hasFloor, addFloor, createKinds, createHolders                 string
	kindRead, kindEnsure, kindSet, kindDelete, kindPut             string
	kindReleaseLast, kindRelease, kindRenew, kindRenewed, withdraw string
	raiseMutex, raiseKind, inspectKinds, inspectHolders            string
}

// nowUS is the server's clock in microseconds since the epoch, the unit of
// the kinds' tables.
const nowUS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"

func newQueries(table string) queries {
	r := strings.NewReplacer("$T", table)
	var q queries
	q.createTable = r.Replace("CREATE TABLE IF NOT EXISTS $T (" +
		"name VARBINARY(255) NOT NULL PRIMARY KEY, " +
		"owner VARBINARY(128) NOT NULL DEFAULT '', " +
		"`count` INT NOT NULL DEFAULT 0, " +
		"fence BIGINT UNSIGNED NOT NULL DEFAULT 0, " +
		"lock_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', " +
		"delay_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', " +
		"version BIGINT UNSIGNED NOT NULL DEFAULT 0, " +
		"fence_floor BIGINT UNSIGNED NOT NULL DEFAULT 0) ENGINE=InnoDB")
	q.createRowTable = r.Replace("CREATE TABLE IF NOT EXISTS $T_rowlock (name VARBINARY(255) NOT NULL PRIMARY KEY) ENGINE=InnoDB")

	// MySQL evaluates ON DUPLICATE KEY UPDATE assignments left to right,
	// each seeing the columns already assigned. The order below makes every
	// condition read the values it needs: version (first) and count, fence,
	// owner use only old values; lock_until's condition reads the new owner,
	// which equals {O} exactly when the call won or the old owner was {O};
	// delay_until's reads the new lock_until and owner, which together say
	// "won". FREE: the lock-delay deadline has passed (a release sets it to
	// now). OURS: {O} holds an unexpired grant.
	free := "delay_until <= {N}"
	ours := "(lock_until > {N} AND owner = {O})"
	win := "(" + free + " OR " + ours + ")"
	acquire := "INSERT INTO $T (name, owner, `count`, fence, lock_until, delay_until, version) VALUES " +
		"({K}, {O}, 1, 1, {N} + INTERVAL {TTL} MICROSECOND, {N} + INTERVAL {TTLD} MICROSECOND, " +
		"LAST_INSERT_ID(" + strconv.Itoa(1<<countBits|1) + ") - " + strconv.Itoa(1<<countBits) + ") " +
		"ON DUPLICATE KEY UPDATE " +
		"version = IF(LAST_INSERT_ID(IF(" + win + ", " +
		"(IF(" + free + ", GREATEST(fence, fence_floor) + 1, fence) << " + strconv.Itoa(countBits) + ") | IF(" + free + ", 1, `count` + 1), " +
		strconv.FormatUint(lockedFlag, 10) + " + GREATEST(0, TIMESTAMPDIFF(MICROSECOND, {N}, delay_until)))) >= " +
		strconv.FormatUint(lockedFlag, 10) + ", version, version + 1), " +
		"`count` = IF(" + ours + ", `count` + 1, IF(" + free + ", 1, `count`)), " +
		"fence = IF(" + free + ", GREATEST(fence, fence_floor) + 1, fence), " +
		"owner = IF(" + win + ", {O}, owner), " +
		"lock_until = IF(" + free + " OR (lock_until > {N} AND owner = {O}), {N} + INTERVAL {TTL} MICROSECOND, lock_until), " +
		"delay_until = IF(lock_until > {N} AND owner = {O}, {N} + INTERVAL {TTLD} MICROSECOND, delay_until)"
	q.leaseAcquire = r.Replace(strings.ReplaceAll(acquire, "{N}", "UTC_TIMESTAMP(6)"))

	// Single-table UPDATE assignments are also left to right: count goes
	// last so the others see the old count; LAST_INSERT_ID reports the
	// count that remains.
	q.leaseRelease = r.Replace("UPDATE $T SET version = version + 1, " +
		"owner = IF(`count` > 1, owner, ''), " +
		"lock_until = IF(`count` > 1, lock_until, UTC_TIMESTAMP(6)), " +
		"delay_until = IF(`count` > 1, delay_until, UTC_TIMESTAMP(6)), " +
		"`count` = LAST_INSERT_ID(`count` - 1) " +
		"WHERE name = {K} AND owner = {O} AND fence = {F} AND `count` > 0 AND lock_until > UTC_TIMESTAMP(6)")

	// Leases of one renewal call share a TTL and lock-delay as a rule; each
	// (TTL, delay) group is one UPDATE whose row-constructor IN list the
	// server resolves through the primary key.
	q.leaseRenew = r.Replace("UPDATE $T SET lock_until = UTC_TIMESTAMP(6) + INTERVAL {TTL} MICROSECOND, " +
		"delay_until = UTC_TIMESTAMP(6) + INTERVAL {TTLD} MICROSECOND, version = version + 1 " +
		"WHERE (name, owner, fence) IN ({ROWS}) AND `count` > 0 AND lock_until > UTC_TIMESTAMP(6)")
	q.leaseRenewed = r.Replace("SELECT name, owner, fence FROM $T WHERE name IN ({KEYS}) AND `count` > 0 AND lock_until > UTC_TIMESTAMP(6)")

	// GET_LOCK and the session's wait_timeout in one statement: the timeout
	// is armed only if the lock was granted. The fence bump follows, gated
	// on this connection holding the lock, and autocommits.
	// The holder's session also takes the lock's wake-up signal {W} (see
	// SignalName) in the same statement, only if it got {L} (IF evaluates
	// one branch), and gives it up after {L} at release.
	// The waiting form (getLock.Block) has GET_LOCK wait up to {T} seconds
	// (fractions allowed) for the lock; KILL QUERY ends the wait with NULL.
	q.getLockWait = "SET SESSION wait_timeout = IF(GET_LOCK({L}, {T}) = 1, {WT} + 0 * COALESCE(GET_LOCK({W}, 0), 0), @@SESSION.wait_timeout)"
	q.getLock = fill(q.getLockWait, "{T}", "0")
	q.fenceInsert = r.Replace("INSERT INTO $T (name, owner, fence) SELECT {K}, {O}, LAST_INSERT_ID(1) FROM DUAL WHERE IS_USED_LOCK({L}) = CONNECTION_ID() " +
		"ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence, fence_floor) + 1), owner = {O}, version = version + 1")
	q.getLockRelease = "SET SESSION wait_timeout = DEFAULT, @dlock_released = RELEASE_LOCK({L}), @dlock_signal = RELEASE_LOCK({W})"

	// rowlock: autocommit off (so the locking read opens a transaction that
	// stays open) and wait_timeout armed, in one statement; switching
	// autocommit back on at release commits and ends the transaction.
	q.rowLock = r.Replace("SELECT 1 FROM $T_rowlock WHERE name = {K} FOR UPDATE NOWAIT")
	// The waiting form (rowLock.Block): the wait is bounded by the
	// session's innodb_lock_wait_timeout, which the release restores.
	q.rowLockWait = r.Replace("SELECT 1 FROM $T_rowlock WHERE name = {K} FOR UPDATE")
	q.rowEnsure = r.Replace("INSERT IGNORE INTO $T_rowlock (name) VALUES ({K})")
	q.fenceBump = r.Replace("INSERT INTO $T (name, owner, fence) VALUES ({K}, {O}, LAST_INSERT_ID(1)) " +
		"ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence, fence_floor) + 1), owner = {O}, version = version + 1")
	// The confirmation after the fence increment also takes the wake-up
	// signal; the release (also that of a refused attempt, which holds no
	// signal: RELEASE_LOCK then changes nothing) gives it up.
	q.rowConfirm = r.Replace("SELECT GET_LOCK({W}, 0) FROM $T_rowlock WHERE name = {K} FOR UPDATE NOWAIT")
	q.rowRelease = "SET autocommit = 1, SESSION wait_timeout = DEFAULT, SESSION innodb_lock_wait_timeout = DEFAULT, @dlock_signal = RELEASE_LOCK({W})"

	// A waiter's wait for a wake-up signal: whether a holder kept it, and
	// then 1 once the signal was had (and given up at once), -1 when the
	// wait ran out.
	q.signalWait = "SELECT IS_USED_LOCK({W}) IS NOT NULL, IF(GET_LOCK({W}, {WT}) = 1, RELEASE_LOCK({W}), -1)"

	q.ping = "SET SESSION wait_timeout = {WT}"

	// A lock is held, for status, until it can be taken: to the end of its
	// lease, or of its lock-delay once the lease ran out unreleased.
	q.inspect = r.Replace("SELECT name, owner, fence, `count`, " +
		"IF(`count` > 0 AND GREATEST(lock_until, delay_until) > UTC_TIMESTAMP(6), TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), GREATEST(lock_until, delay_until)), 0) " +
		"FROM $T WHERE LEFT(name, LENGTH({P})) = {P} ORDER BY name")
	q.inspectRow = r.Replace("SELECT name FROM $T_rowlock WHERE LEFT(name, LENGTH({P})) = {P} FOR UPDATE SKIP LOCKED")
	q.hasFloor = r.Replace("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '$T' AND COLUMN_NAME = 'fence_floor'")
	q.addFloor = r.Replace("ALTER TABLE $T ADD COLUMN fence_floor BIGINT UNSIGNED NOT NULL DEFAULT 0")
	q.createKinds = r.Replace("CREATE TABLE IF NOT EXISTS $T_kinds (" +
		"name VARBINARY(255) NOT NULL, grp SMALLINT NOT NULL, " +
		"fence BIGINT UNSIGNED NOT NULL DEFAULT 0, permits INT NOT NULL DEFAULT 0, " +
		"PRIMARY KEY (name, grp)) ENGINE=InnoDB")
	q.createHolders = r.Replace("CREATE TABLE IF NOT EXISTS $T_holders (" +
		"name VARBINARY(255) NOT NULL, grp SMALLINT NOT NULL, owner VARBINARY(128) NOT NULL, kind SMALLINT NOT NULL, " +
		"`count` INT NOT NULL, fence BIGINT UNSIGNED NOT NULL, lock_until BIGINT NOT NULL, delay_until BIGINT NOT NULL, " +
		"PRIMARY KEY (name, grp, owner, kind)) ENGINE=InnoDB")
	// The lock's _kinds row and its holders in one locking read: the
	// row locks are taken (the _kinds row first), and a locking read sees
	// the latest committed rows whatever the isolation level.
	q.kindRead = r.Replace("SELECT k.fence, k.permits, " + nowUS + ", h.owner, h.kind, h.`count`, h.fence, h.lock_until, h.delay_until " +
		"FROM $T_kinds k LEFT JOIN $T_holders h ON h.name = k.name AND h.grp = k.grp " +
		"WHERE k.name = {K} AND k.grp = {G} FOR UPDATE")
	q.kindEnsure = r.Replace("INSERT IGNORE INTO $T_kinds (name, grp) VALUES ({K}, {G})")
	q.kindSet = r.Replace("UPDATE $T_kinds SET fence = {F}, permits = {P} WHERE name = {K} AND grp = {G}")
	q.kindDelete = r.Replace("DELETE FROM $T_holders WHERE name = {K} AND grp = {G} AND (owner, kind) IN ({ROWS})")
	q.kindPut = r.Replace("INSERT INTO $T_holders (name, grp, owner, kind, `count`, fence, lock_until, delay_until) " +
		"VALUES ({K}, {G}, {O}, {KIND}, {C}, {F}, {LU}, {DU}) " +
		"ON DUPLICATE KEY UPDATE `count` = {C}, fence = {F}, lock_until = {LU}, delay_until = {DU}")
	holder := "name = {K} AND grp = {G} AND owner = {O} AND kind = {KIND} AND ({F} = 0 OR fence = {F}) AND lock_until > " + nowUS
	q.kindReleaseLast = r.Replace("DELETE FROM $T_holders WHERE " + holder + " AND `count` <= 1")
	q.kindRelease = r.Replace("UPDATE $T_holders SET `count` = LAST_INSERT_ID(`count` - 1) WHERE " + holder + " AND `count` > 1")
	q.kindRenew = r.Replace("UPDATE $T_holders SET lock_until = " + nowUS + " + {TTL}, delay_until = " + nowUS + " + {TTLD} " +
		"WHERE (name, grp, owner, kind, fence) IN ({ROWS}) AND lock_until > " + nowUS)
	q.kindRenewed = r.Replace("SELECT name, owner, kind, fence FROM $T_holders WHERE name IN ({KEYS}) AND lock_until > " + nowUS)
	q.withdraw = r.Replace("DELETE FROM $T_holders WHERE name = {K} AND grp = {G} AND owner = {O} AND kind = {KIND}")
	// A held mutex keeps its token (its renewals and release match it):
	// the raise waits in fence_floor, which the next new grant reads.
	// fence_floor is assigned first, so both read the old fence.
	live := "(`count` > 0 AND lock_until > UTC_TIMESTAMP(6))"
	q.raiseMutex = r.Replace("INSERT INTO $T (name, fence) VALUES ({K}, {F}) ON DUPLICATE KEY UPDATE " +
		"fence_floor = IF(" + live + ", GREATEST(fence_floor, {F}), fence_floor), " +
		"fence = IF(" + live + ", fence, GREATEST(fence, {F})), version = version + 1")
	q.raiseKind = r.Replace("INSERT INTO $T_kinds (name, grp, fence) VALUES ({K}, {G}, {F}) ON DUPLICATE KEY UPDATE fence = GREATEST(fence, {F})")
	q.inspectKinds = r.Replace("SELECT name, grp, fence, permits, " + nowUS + " FROM $T_kinds WHERE LEFT(name, LENGTH({P})) = {P}")
	q.inspectHolders = r.Replace("SELECT name, grp, owner, kind, `count`, fence, lock_until, delay_until FROM $T_holders WHERE LEFT(name, LENGTH({P})) = {P}")
	return q
}

// LockName returns the GET_LOCK name ModeGetLock uses for name. Names of up
// to 64 bytes made only of [a-z0-9._/:-] are used as they are (readable in
// IS_USED_LOCK); any other name becomes "#" and 63 hex digits of its SHA-256.
// MySQL compares lock names case-insensitively and limits them to 64
// characters; this mapping never lets two different names meet. Lock names
// are server-wide, shared by every database on the server.
func LockName(name string) string {
	if len(name) <= 64 {
		plain := true
		for i := 0; i < len(name); i++ {
			c := name[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("._/:-", c) >= 0) {
				plain = false
				break
			}
		}
		if plain {
			return name
		}
	}
	sum := sha256.Sum256([]byte(name))
	return "#" + hex.EncodeToString(sum[:])[:63]
}

// SignalName returns the GET_LOCK name of name's wake-up signal: a holder
// keeps it while it holds name, and waiters wait for it to be free (see the
// package documentation). "~" and 63 hex digits of name's SHA-256: never a
// LockName.
func SignalName(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "~" + hex.EncodeToString(sum[:])[:63]
}

func errNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// isInterrupted reports a statement ended by KILL QUERY
// (ER_QUERY_INTERRUPTED, 1317).
func isInterrupted(err error) bool { return errNumber(err) == 1317 }

// isLockNotAvailable reports NOWAIT's refusal: MySQL 8 ER_LOCK_NOWAIT (3572),
// MariaDB ER_LOCK_WAIT_TIMEOUT (1205).
func isLockNotAvailable(err error) bool {
	n := errNumber(err)
	return n == 3572 || n == 1205
}
