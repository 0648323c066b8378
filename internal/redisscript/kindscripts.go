package redisscript

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
)

// The scripts of the read/write lock and the semaphore (see KindKeys for
// the keys). The writer of a read/write lock is kept like a mutex (one
// string, PX = lease + lock-delay). Readers and permit holders are a holder
// set: a zset of owners scored by the end of their place (lease expiry
// plus lock-delay, server ms) beside a hash of each one's value
//
//	count \n token \n expiry \n lock-delay
//
// (expiry always set, lock-delay empty or ms). A holder whose expiry has
// passed no longer holds (it cannot renew, re-enter or release) but keeps
// its place until its score: a reader blocks writers, a permit stays
// counted. Entries whose score has passed are purged by the next script
// that touches the set. Both keys live as long as their longest place (each
// grant and renewal extends their PX to at least its own), and are deleted
// when their last holder releases.
//
// Releases publish on the name's release channel a payload starting with
// '*' ("*r<token>", "*w<token>", "*p<token>"): such a message wakes every
// waiter of the channel on each hub, since a write release may let many
// readers in and a waiter's kind is not known to the hub.
const kindPrelude = clock + `
local function parse(v)
  return string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
end
local function hparse(v)
  return string.match(v, '^(%d+)\n(%d+)\n(%d+)\n(%d*)$')
end
local function int(n)
  return string.format('%.0f', n)
end
local function counter(k)
  local v = redis.pcall('GET', k)
  if not v then return 0 end
  if type(v) ~= 'string' or not string.match(v, '^%d+$') then return nil end
  return tonumber(v)
end
-- typed reports whether key k is missing or of type t.
local function typed(k, t)
  local ty = redis.call('TYPE', k)
  if type(ty) == 'table' then ty = ty.ok end
  return ty == 'none' or ty == t
end
-- purge drops the holders of set z (values in hash h) whose place ended by t.
local function purge(z, h, t)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', t)
  for _, o in ipairs(gone) do
    redis.call('HDEL', h, o)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', z, '-inf', t)
  end
end
-- keep makes each key live at least ms.
local function keep(ms, a, b)
  if redis.call('PTTL', a) < ms then redis.call('PEXPIRE', a, ms) end
  if b and redis.call('PTTL', b) < ms then redis.call('PEXPIRE', b, ms) end
end
-- incr takes the next token from counter k, or returns nil when a key dlock
-- did not write is there.
local function incr(k)
  local n = redis.pcall('INCR', k)
  if type(n) ~= 'number' or n < 1 then
    if type(n) == 'number' then redis.call('DECR', k) end
    return nil
  end
  return int(n)
end
-- enter grants owner a place in holder set z/h (re-entry when it holds a
-- live one: count up, token kept). Returns count, token; nil when the
-- counter is foreign.
local function enter(z, h, fk, owner, ttl, delay, t)
  local ne = t + ttl
  local hv = redis.call('HGET', h, owner)
  if hv then
    local c, f, e = hparse(hv)
    if c and tonumber(e) > t then
      local count = tonumber(c) + 1
      redis.call('HSET', h, owner, int(count) .. '\n' .. f .. '\n' .. int(ne) .. '\n' .. (delay > 0 and int(delay) or ''))
      redis.call('ZADD', z, ne + delay, owner)
      keep(ttl + delay, z, h)
      return count, f
    end
  end
  return nil
end
local function grant(z, h, fk, owner, ttl, delay, t)
  local f = incr(fk)
  if not f then return nil end
  local ne = t + ttl
  redis.call('HSET', h, owner, '1\n' .. f .. '\n' .. int(ne) .. '\n' .. (delay > 0 and int(delay) or ''))
  redis.call('ZADD', z, ne + delay, owner)
  keep(ttl + delay, z, h)
  return f
end
`

// writeAcquireSrc grants, re-enters or refuses the write side.
//
//	KEYS[1] writer, KEYS[2] readers, KEYS[3] readers hash, KEYS[4] marks, KEYS[5] fence
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms, ARGV[4] mark
//	lifetime ms (0: the caller does not wait: no mark)
//
// A refused caller with a mark lifetime leaves (or renews) its waiting
// writer mark; a granted one removes it. Returns as acquireSrc, with code 3
// for a refusal by readers (pttl: until the last reader's place ends).
var writeAcquireSrc = kindPrelude + `
local owner, ttl, delay, markms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not typed(KEYS[2], 'zset') or not typed(KEYS[3], 'hash') or not typed(KEYS[4], 'zset') then
  return {0, redis.call('PTTL', KEYS[2]), '0', '', 1}
end
local t = now()
local function mark()
  if markms > 0 then
    redis.call('ZADD', KEYS[4], t + markms, owner)
    keep(markms, KEYS[4])
  end
end
local v = redis.pcall('GET', KEYS[1])
if v then
  local c, f, e, d, o
  if type(v) == 'string' then c, f, e, d, o = parse(v) end
  if c and o == owner and (e == '' or tonumber(e) > t) then
    local ne, nd = '', ''
    if delay > 0 then ne, nd = int(t + ttl), ARGV[3] end
    local count = tonumber(c) + 1
    redis.call('SET', KEYS[1], int(count) .. '\n' .. f .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    redis.call('ZREM', KEYS[4], owner)
    return {1, count, f}
  end
  mark()
  if not c then return {0, redis.call('PTTL', KEYS[1]), '0', '', 1} end
  return {0, redis.call('PTTL', KEYS[1]), f, o, 0}
end
purge(KEYS[2], KEYS[3], t)
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[1] then
  mark()
  return {0, tonumber(last[2]) - t, int(counter(KEYS[5]) or 0), '', 3}
end
local f = incr(KEYS[5])
if not f then return {0, redis.call('PTTL', KEYS[5]), '0', '', 1} end
local ne, nd = '', ''
if delay > 0 then ne, nd = int(t + ttl), ARGV[3] end
redis.call('SET', KEYS[1], '1\n' .. f .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
redis.call('ZREM', KEYS[4], owner)
return {1, 1, f}
`

// readAcquireSrc grants, re-enters or refuses the read side.
//
//	KEYS[1] writer, KEYS[2] readers, KEYS[3] readers hash, KEYS[4] marks, KEYS[5] fence
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms
//
// A writer (holding, or in its lock-delay) refuses every read (code 0, or
// 1 for a key dlock did not write). A live reader re-enters. A waiting
// writer's mark of another owner refuses new readers (code 4, pttl: until
// the first such mark ends).
var readAcquireSrc = kindPrelude + `
local owner, ttl, delay = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.pcall('GET', KEYS[1])
if v then
  local c, f, e, d, o
  if type(v) == 'string' then c, f, e, d, o = parse(v) end
  if not c then return {0, redis.call('PTTL', KEYS[1]), '0', '', 1} end
  return {0, redis.call('PTTL', KEYS[1]), f, o, 0}
end
if not typed(KEYS[2], 'zset') or not typed(KEYS[3], 'hash') or not typed(KEYS[4], 'zset') then
  return {0, redis.call('PTTL', KEYS[2]), '0', '', 1}
end
local t = now()
local count, f = enter(KEYS[2], KEYS[3], KEYS[5], owner, ttl, delay, t)
if count then return {1, count, f} end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', t)
local m = redis.call('ZRANGE', KEYS[4], 0, 1, 'WITHSCORES')
if m[1] == owner then m = {m[3], m[4]} end
if m[1] then
  return {0, tonumber(m[2]) - t, int(counter(KEYS[5]) or 0), '', 4}
end
purge(KEYS[2], KEYS[3], t)
f = grant(KEYS[2], KEYS[3], KEYS[5], owner, ttl, delay, t)
if not f then return {0, redis.call('PTTL', KEYS[5]), '0', '', 1} end
return {1, 1, f}
`

// permitAcquireSrc grants, re-enters or refuses one permit.
//
//	KEYS[1] holders, KEYS[2] holders hash, KEYS[3] fence
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms, ARGV[4] permits
//
// The permit count is stored in the hash (field "") with the first grant
// and binds while any permit is taken (held or in its lock-delay): a
// request with another count returns {2, stored count} and changes
// nothing. A full semaphore refuses with code 3, pttl until the first place
// ends.
var permitAcquireSrc = kindPrelude + `
local owner, ttl, delay = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if not typed(KEYS[1], 'zset') or not typed(KEYS[2], 'hash') then
  return {0, redis.call('PTTL', KEYS[1]), '0', '', 1}
end
local t = now()
purge(KEYS[1], KEYS[2], t)
local taken = redis.call('ZCARD', KEYS[1])
if taken > 0 then
  local n = redis.call('HGET', KEYS[2], '')
  if n and n ~= ARGV[4] then return {2, n, '0'} end
end
local count, f = enter(KEYS[1], KEYS[2], KEYS[3], owner, ttl, delay, t)
if count then return {1, count, f} end
if taken >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - t, int(counter(KEYS[3]) or 0), '', 3}
end
f = grant(KEYS[1], KEYS[2], KEYS[3], owner, ttl, delay, t)
if not f then return {0, redis.call('PTTL', KEYS[3]), '0', '', 1} end
redis.call('HSET', KEYS[2], '', ARGV[4])
return {1, 1, f}
`

// setReleaseSrc gives up one hold of a reader or a permit holder.
//
//	KEYS[1] holders, KEYS[2] holders hash
//	ARGV[1] owner, ARGV[2] token ("0": do not check), ARGV[3] channel ("":
//	publish nothing), ARGV[4] "r" (reader) or "p" (permit)
//
// Returns the remaining count, or -1 when the owner does not hold a live
// place. The last hold frees the place at once (no lock-delay) and
// publishes "*<kind><token>": for a permit always, for a reader only when
// no reader place is left (only then can a writer get in). The keys go with
// their last holder.
var setReleaseSrc = kindPrelude + `
if not typed(KEYS[1], 'zset') or not typed(KEYS[2], 'hash') then return -1 end
local hv = redis.call('HGET', KEYS[2], ARGV[1])
if not hv then return -1 end
local c, f, e, d = hparse(hv)
if not c or (ARGV[2] ~= '0' and f ~= ARGV[2]) or tonumber(e) <= now() then return -1 end
local count = tonumber(c) - 1
if count > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], int(count) .. '\n' .. f .. '\n' .. e .. '\n' .. d)
  return count
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
purge(KEYS[1], KEYS[2], now())
local left = redis.call('ZCARD', KEYS[1])
if left == 0 then redis.call('DEL', KEYS[1], KEYS[2]) end
if ARGV[3] ~= '' and (ARGV[4] == 'p' or left == 0) then
  redis.call('PUBLISH', ARGV[3], '*' .. ARGV[4] .. f)
end
return 0
`

// writeReleaseSrc gives up one hold of the writer.
//
//	KEYS[1] writer
//	ARGV[1] owner, ARGV[2] token ("0": do not check), ARGV[3] channel ("":
//	publish nothing)
//
// As releaseSrc without a queue: the last hold deletes the key and
// publishes "*w<token>", which wakes every waiting reader and writer.
var writeReleaseSrc = kindPrelude + `
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return -1 end
local c, f, e, d, o = parse(v)
if not c or o ~= ARGV[1] or (ARGV[2] ~= '0' and f ~= ARGV[2]) or (e ~= '' and tonumber(e) <= now()) then
  return -1
end
local count = tonumber(c) - 1
if count > 0 then
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('SET', KEYS[1], int(count) .. '\n' .. f .. '\n' .. e .. '\n' .. d .. '\n' .. o, 'PX', math.max(pttl, 1))
  return count
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], '*w' .. f)
end
return 0
`

// withdrawSrc removes a waiting writer's mark.
//
//	KEYS[1] marks, ARGV[1] owner, ARGV[2] channel
//
// When it was the last mark, "*m<owner>" is published so that readers it held
// back try again. Returns 1 if the owner had a mark.
var withdrawSrc = `
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then return 0 end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if ARGV[2] ~= '' and redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('PUBLISH', ARGV[2], '*m' .. ARGV[1])
end
return 1
`

// renewSetSrc extends many reader or permit places in one call.
//
//	KEYS[2i-1] holders of lease i, KEYS[2i] its holders hash
//	ARGV[3i-2] owner, ARGV[3i-1] token ("0": do not check), ARGV[3i] TTL ms
//
// Returns one integer per lease: 1 renewed, 0 not held. The lock-delay of
// the grant is kept.
var renewSetSrc = kindPrelude + `
local t = now()
local r = {}
for i = 1, #KEYS / 2 do
  local z, h, b = KEYS[2 * i - 1], KEYS[2 * i], (i - 1) * 3
  r[i] = 0
  if typed(z, 'zset') and typed(h, 'hash') then
    local hv = redis.call('HGET', h, ARGV[b + 1])
    if hv then
      local c, f, e, d = hparse(hv)
      if c and (ARGV[b + 2] == '0' or f == ARGV[b + 2]) and tonumber(e) > t then
        local ttl = tonumber(ARGV[b + 3])
        local delay = tonumber(d) or 0
        redis.call('HSET', h, ARGV[b + 1], c .. '\n' .. f .. '\n' .. int(t + ttl) .. '\n' .. d)
        redis.call('ZADD', z, t + ttl + delay, ARGV[b + 1])
        keep(ttl + delay, z, h)
        r[i] = 1
      end
    end
  end
end
return r
`

// dropKindSrc makes the server forget every current grant of a holder set
// (ARGV[1] "set"; KEYS holders, holders hash) or the writer (ARGV[1] "w";
// KEYS[1] writer) as if they had been lost, without lock-delay: nothing is
// left of them, nothing is published, and the fencing counter is untouched.
// Returns the number of grants dropped. For tests.
var dropKindSrc = kindPrelude + `
if ARGV[1] == 'w' then
  local v = redis.pcall('GET', KEYS[1])
  if type(v) ~= 'string' or not parse(v) then return 0 end
  redis.call('DEL', KEYS[1])
  return 1
end
if not typed(KEYS[1], 'zset') or not typed(KEYS[2], 'hash') then return 0 end
local t = now()
local all = redis.call('ZRANGE', KEYS[1], 0, -1)
local n = 0
for _, o in ipairs(all) do
  local c, f, e = hparse(redis.call('HGET', KEYS[2], o) or '')
  if c and tonumber(e) > t then n = n + 1 end
  redis.call('HDEL', KEYS[2], o)
end
redis.call('DEL', KEYS[1])
if redis.call('HLEN', KEYS[2]) <= 1 then redis.call('DEL', KEYS[2]) end
return n
`

// fenceSetSrc raises a holder set's fencing counter to at least a token
// (Redlock writes the token it chose back to the nodes) and records the
// token in the owner's place.
//
//	KEYS[1] holders hash, KEYS[2] fence counter
//	ARGV[1] owner, ARGV[2] token
//
// Returns 1, or 0 without writing anything when a key dlock did not write
// is at the counter.
var fenceSetSrc = kindPrelude + `
local cur = counter(KEYS[2])
if not cur then return 0 end
if cur < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2]) end
if not typed(KEYS[1], 'hash') then return 1 end
local hv = redis.call('HGET', KEYS[1], ARGV[1])
if hv then
  local c, f, e, d = hparse(hv)
  if c and f ~= ARGV[2] then
    redis.call('HSET', KEYS[1], ARGV[1], c .. '\n' .. ARGV[2] .. '\n' .. e .. '\n' .. d)
  end
end
return 1
`

// markSrc leaves (or renews) a waiting writer's mark for ARGV[2] ms.
//
//	KEYS[1] marks, ARGV[1] owner, ARGV[2] lifetime ms
var markSrc = kindPrelude + `
if not typed(KEYS[1], 'zset') then return 0 end
local ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now() + ms, ARGV[1])
keep(ms, KEYS[1])
return 1
`

var (
	fenceSetScript = redis.NewScript(fenceSetSrc)
	markScript     = redis.NewScript(markSrc)
)

// WriteFenceKind is WriteFence for a grant of kind kk.Kind: it raises the
// kind's counter to at least token and records token in owner's grant
// (the writer, or owner's reader or permit place). It fails with
// ErrForeignFence, writing nothing, when a key dlock did not write is at
// the counter.
func WriteFenceKind(ctx context.Context, c redis.Scripter, kk KindKeys, owner string, token uint64) error {
	var cmd *redis.Cmd
	if kk.Kind == driver.Write || kk.Kind == driver.Exclusive {
		cmd = fenceScript.Run(ctx, c, []string{kk.Writer, kk.Fence}, owner, strconv.FormatUint(token, 10))
	} else {
		cmd = fenceSetScript.Run(ctx, c, []string{kk.Values, kk.Fence}, owner, strconv.FormatUint(token, 10))
	}
	n, err := cmd.Int64()
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrForeignFence
	}
	return nil
}

// Mark leaves (or renews) owner's waiting writer mark on kk's read/write
// lock for life.
func Mark(ctx context.Context, c redis.Scripter, kk KindKeys, owner string, life time.Duration) error {
	return markScript.Run(ctx, c, []string{kk.Marks}, owner, Millis(life)).Err()
}

var (
	writeAcquireScript  = redis.NewScript(writeAcquireSrc)
	readAcquireScript   = redis.NewScript(readAcquireSrc)
	permitAcquireScript = redis.NewScript(permitAcquireSrc)
	setReleaseScript    = redis.NewScript(setReleaseSrc)
	writeReleaseScript  = redis.NewScript(writeReleaseSrc)
	withdrawScript      = redis.NewScript(withdrawSrc)
	renewSetScript      = redis.NewScript(renewSetSrc)
	dropKindScript      = redis.NewScript(dropKindSrc)
)

// KindResult is AcquireResult with the refusals only kinds have.
type KindResult struct {
	AcquireResult
	// Readers reports a write refused by readers (or a semaphore that is
	// full): PTTL is until the last reader's (first holder's) place ends.
	Readers bool
	// Marked reports a read refused by a waiting writer's mark: PTTL is
	// until that mark ends.
	Marked bool
	// StoredPermits is, when not zero, the permit count stored with a
	// semaphore that differs from the request's: nothing was changed.
	StoredPermits int
}

// AcquireKind runs the acquire script of req.Kind (Read, Write or Permit)
// for one lock on one server. mark is the lifetime of a refused waiting
// writer's mark (zero: leave none).
func AcquireKind(ctx context.Context, c redis.Scripter, kk KindKeys, req driver.AcquireRequest, mark time.Duration) (KindResult, error) {
	var (
		cmd *redis.Cmd
		ttl = Millis(req.TTL)
		dl  = delayMillis(req.LockDelay)
	)
	switch req.Kind {
	case driver.Write:
		var m int64
		if mark > 0 {
			m = Millis(mark)
		}
		cmd = writeAcquireScript.Run(ctx, c, kk.rwKeys(), req.Owner, ttl, dl, m)
	case driver.Read:
		cmd = readAcquireScript.Run(ctx, c, kk.rwKeys(), req.Owner, ttl, dl)
	case driver.Permit:
		cmd = permitAcquireScript.Run(ctx, c, []string{kk.Holders, kk.Values, kk.Fence}, req.Owner, ttl, dl, req.Permits)
	default:
		return KindResult{}, CheckKind(req.Kind)
	}
	v, err := cmd.Slice()
	if err != nil {
		return KindResult{}, err
	}
	if len(v) >= 2 {
		if code, _ := toInt(v[0]); code == 2 {
			n, err := toInt(v[1])
			if err != nil || n < 1 {
				return KindResult{}, fmt.Errorf("unexpected stored permit count %v", v[1])
			}
			return KindResult{StoredPermits: int(n)}, nil
		}
	}
	r, err := parseAcquire(v)
	if err != nil {
		return KindResult{}, err
	}
	kr := KindResult{AcquireResult: r}
	if !r.Granted && len(v) > 4 {
		switch f, _ := toInt(v[4]); f {
		case 3:
			kr.Readers = true
		case 4:
			kr.Marked = true
		}
	}
	return kr, nil
}

func (kk KindKeys) rwKeys() []string {
	return []string{kk.Writer, kk.Holders, kk.Values, kk.Marks, kk.Fence}
}

// ReleaseKind gives up one hold of owner's grant of kind kk.Kind (see
// setReleaseSrc, writeReleaseSrc). With kk.Channel empty nothing is
// published.
func ReleaseKind(ctx context.Context, c redis.Scripter, kk KindKeys, owner string, token uint64) (remaining int, held bool, err error) {
	tok := strconv.FormatUint(token, 10)
	var cmd *redis.Cmd
	switch kk.Kind {
	case driver.Write:
		cmd = writeReleaseScript.Run(ctx, c, []string{kk.Writer}, owner, tok, kk.Channel)
	case driver.Read:
		cmd = setReleaseScript.Run(ctx, c, []string{kk.Holders, kk.Values}, owner, tok, kk.Channel, "r")
	case driver.Permit:
		cmd = setReleaseScript.Run(ctx, c, []string{kk.Holders, kk.Values}, owner, tok, kk.Channel, "p")
	default:
		return 0, false, CheckKind(kk.Kind)
	}
	n, err := cmd.Int64()
	if err != nil {
		return 0, false, err
	}
	if n < 0 {
		return 0, false, nil
	}
	return int(n), true, nil
}

// Withdraw removes owner's waiting writer mark from kk's read/write lock,
// waking the readers it held back when it was the last.
func Withdraw(ctx context.Context, c redis.Scripter, kk KindKeys, owner string) error {
	if kk.Marks == "" {
		return nil
	}
	return withdrawScript.Run(ctx, c, []string{kk.Marks}, owner, kk.Channel).Err()
}

// DropKind makes the server forget every current grant of kk's kind (the
// readers, the writer, the permit holders) as if they had been lost,
// without lock-delay (see dropKindSrc). It reports whether there was one.
// For tests and harnesses.
func DropKind(ctx context.Context, c redis.Scripter, kk KindKeys) (bool, error) {
	var cmd *redis.Cmd
	if kk.Kind == driver.Write || kk.Kind == driver.Exclusive {
		cmd = dropKindScript.Run(ctx, c, []string{kk.Writer}, "w")
	} else {
		cmd = dropKindScript.Run(ctx, c, []string{kk.Holders, kk.Values}, "set")
	}
	n, err := cmd.Int64()
	return n > 0, err
}
