package redisscript

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// clock is the lazily read server clock of every script: now() reads TIME
// once (after redis.replicate_commands, see below). The mutex acquire and
// release scripts define it (with queueClock) after their fast paths (a
// free lock nobody waits for taken without lock-delay, its one hold
// released with nobody queued), so those build no closure at all.
const clock = `
local nowms
local function now()
  if not nowms then
    if redis.replicate_commands then pcall(redis.replicate_commands) end
    local t = redis.call('TIME')
    nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return nowms
end
`

// queueClock is clock and dropDead, the waiter queue's clean-up shared by
// the mutex acquire and release scripts (and their grant-in-release
// variants): dropDead(q, qd, qg, stop) drops the entries at the head of
// queue q whose deadline in qd is missing or past (from qg too, when not
// nil), up to the first live one or stop, and returns the head left (nil
// when the queue is empty) and whether it dropped any. The server's time
// is read only when the queue has a head.
const queueClock = clock + `
local function dropDead(q, qd, qg, stop)
  local head = redis.call('ZRANGE', q, 0, 0)[1]
  if not head then return nil, false end
  local t = now()
  local purged = false
  while head and head ~= stop do
    local dl = redis.call('HGET', qd, head)
    if dl and tonumber(dl) > t then break end
    redis.call('ZREM', q, head)
    redis.call('HDEL', qd, head)
    if qg then redis.call('HDEL', qg, head) end
    purged = true
    head = redis.call('ZRANGE', q, 0, 0)[1]
  end
  return head, purged
end
`

// readHeld is the part of the mutex acquire scripts (acquireSrc and
// waitAcquireSrc) after their fast paths that reads the lock: the
// arguments owner, ttl, delay and wait, the lock's value v (GET with
// pcall: false when absent, an error table for another type), its fields
// c, f, e, d, o when it is a value dlock wrote, and mine, true when that
// value is owner's live lease. It needs now() (queueClock) defined before it.
const readHeld = `
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local delay = tonumber(ARGV[3])
local wait = tonumber(ARGV[4])
local v = redis.pcall('GET', KEYS[1])
local c, f, e, d, o
if type(v) == 'string' then
  c, f, e, d, o = string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
end
local mine = c and o == owner and (e == '' or tonumber(e) > now())
`

// A lock's value is one string, so that a grant is one SET ... PX and a
// check one GET (cheaper on the server than a hash):
//
//	count \n token \n exp \n delay \n owner
//
// exp (the lease's own expiry, server ms) and delay (ms) are empty without a
// lock-delay: the key's PX expiry is then the lease's, and a key that exists
// is a live lease. The owner comes last, so it may contain any byte.
//
// Scripts read the server's clock (TIME) only when a lock-delay or the
// waiter queue is involved, and always before their first write, after calling
// redis.replicate_commands: that lets them write after TIME on servers older
// than 5.0 (later servers replicate scripts by effects and treat the call as
// a no-op).
var prelude = clock + `
local function parse(v)
  return string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
end
-- live reports whether a lease with expiry field e has not expired.
local function live(e)
  return e == '' or tonumber(e) > now()
end
local function int(n)
  return string.format('%.0f', n)
end
local function value(count, fence, e, d, owner)
  return int(count) .. '\n' .. fence .. '\n' .. e .. '\n' .. d .. '\n' .. owner
end
-- read returns 'none' for a missing key, 'ours' and the fields of a lock
-- value dlock wrote, or 'foreign' for anything else at the key (another
-- client's string, a hash, a list, ...): never an error.
local function read(k)
  local v = redis.pcall('GET', k)
  if not v then return 'none' end
  if type(v) ~= 'string' then return 'foreign' end
  local c, f, e, d, o = parse(v)
  if not c then return 'foreign' end
  return 'ours', c, f, e, d, o
end
-- counter returns the fencing counter at k (0 when missing), or nil when
-- something else is stored there.
local function counter(k)
  local v = redis.pcall('GET', k)
  if not v then return 0 end
  if type(v) ~= 'string' or not string.match(v, '^%d+$') then return nil end
  return tonumber(v)
end
`

// acquireSrc grants, re-enters or refuses a lock, and keeps the lock's
// waiter queue.
//
//	KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] queue deadlines
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms,
//	ARGV[4] queue entry lifetime ms (0: the caller does not wait, is not
//	queued), ARGV[5] release channel ("": publish nothing), ARGV[6]
//	optional: the queue score of a waiter (default: the server's time)
//
// The key lives for TTL + lock-delay (PX). With a lock-delay, between exp
// and the key's expiry the lock is in its lock-delay: the key still exists,
// so nobody can take it, but it is no longer held, so its owner can neither
// renew, re-enter nor release it.
//
// A free lock goes to the first live waiter of its queue (a zset of owners
// by arrival time, server ms, beside a hash of each entry's deadline), or to
// anyone when the queue is empty. Entries past their deadline are dropped
// when they reach the head; when that makes a live waiter first while the
// lock is free, it is woken (published "0\nowner" on the channel). A
// refused caller that waits (ARGV[4] > 0) is queued, or its entry's
// deadline renewed; a granted one leaves the queue.
//
// Returns the fence, one integer, on a new grant (hold count 1), {1,
// count, fence} on a re-entry, {0, pttl, fence, owner, 0} on a refusal by
// a holder, {0, 0, 0, "", 2} on a refusal because another waiter
// is first in the queue, and {0, pttl, 0, "", 1} when a key dlock did not
// write (any type) is at the lock key, or at the fence counter of a lock
// that is not held: such a key is a lock held by an unknown owner until it
// expires (pttl) or is deleted (pttl -1). Nothing is written at those keys.
var acquireSrc = `
local free = redis.call('EXISTS', KEYS[1], KEYS[3]) == 0
if free and ARGV[3] == '0' then
  -- The common case, a free lock nobody waits for, without lock-delay:
  -- no queue to keep, no clock to read. The fast path is kept to the
  -- fewest Lua operations (the server's time per call is most of what a
  -- grant costs beyond a plain SET NX): no closure, no string.format
  -- (a number below 1e14 concatenates as its integer digits), the TTL
  -- passed to PX as the caller wrote it.
  local n = redis.pcall('INCR', KEYS[2])
  if type(n) == 'number' and n >= 1 then
    redis.call('SET', KEYS[1], '1\n' .. (n < 1e14 and n or string.format('%.0f', n)) .. '\n\n\n' .. ARGV[1], 'PX', ARGV[2])
    return n
  end
  if type(n) == 'number' then redis.call('DECR', KEYS[2]) end
  return {0, redis.call('PTTL', KEYS[2]), '0', '', 1}
end
` + queueClock + `
if free then
  -- Free, nobody waits, with a lock-delay.
  local ttl = tonumber(ARGV[2])
  local ne, px = '\n\n', ttl
  local delay = tonumber(ARGV[3])
  if delay > 0 then
    ne, px = '\n' .. string.format('%.0f', now() + ttl) .. '\n' .. ARGV[3], ttl + delay
  end
  local n = redis.pcall('INCR', KEYS[2])
  if type(n) ~= 'number' or n < 1 then
    if type(n) == 'number' then redis.call('DECR', KEYS[2]) end
    return {0, redis.call('PTTL', KEYS[2]), '0', '', 1}
  end
  redis.call('SET', KEYS[1], '1\n' .. string.format('%.0f', n) .. ne .. '\n' .. ARGV[1], 'PX', px)
  return n
end
` + readHeld + `
if v then
  if mine then
    local ne, nd = '', ''
    if delay > 0 then
      ne, nd = string.format('%.0f', now() + ttl), ARGV[3]
    end
    local count = tonumber(c) + 1
    redis.call('SET', KEYS[1], string.format('%.0f', count) .. '\n' .. f .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    return {1, count, f}
  end
else
  local head, purged = dropDead(KEYS[3], KEYS[4], nil, owner)
  if head and head ~= owner then
    if purged and ARGV[5] ~= '' then
      redis.call('PUBLISH', ARGV[5], '0\n' .. head)
    end
    v = 'queued'
  end
  if not v then
    local ne, nd = '', ''
    if delay > 0 then
      ne, nd = string.format('%.0f', now() + ttl), ARGV[3]
    end
    local n = redis.pcall('INCR', KEYS[2])
    if type(n) ~= 'number' or n < 1 then
      if type(n) == 'number' then redis.call('DECR', KEYS[2]) end
      return {0, redis.call('PTTL', KEYS[2]), '0', '', 1}
    end
    if head then
      redis.call('ZREM', KEYS[3], owner)
      redis.call('HDEL', KEYS[4], owner)
    end
    redis.call('SET', KEYS[1], '1\n' .. string.format('%.0f', n) .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    return n
  end
end
if wait > 0 then
  local t = now()
  redis.call('ZADD', KEYS[3], 'NX', ARGV[6] or t, owner)
  redis.call('HSET', KEYS[4], owner, t + wait)
  redis.call('PEXPIRE', KEYS[3], wait)
  redis.call('PEXPIRE', KEYS[4], wait)
end
if v == 'queued' then
  return {0, 0, '0', '', 2}
end
if not c then
  return {0, redis.call('PTTL', KEYS[1]), '0', '', 1}
end
return {0, redis.call('PTTL', KEYS[1]), f, o, 0}
`

// releaseSrc gives up one hold.
//
//	KEYS[1] lock, KEYS[2] queue, KEYS[3] queue deadlines
//	ARGV[1] owner, ARGV[2] token ("0": do not check), ARGV[3] release channel
//	("": publish nothing)
//
// Returns the remaining hold count, or -1 when the owner does not hold the
// lock (absent, another owner, another grant, past its lease expiry, or a
// key dlock did not write). The last hold deletes the key at once (no
// lock-delay) and publishes on the release channel: the grant's token, or,
// when waiters are queued, the token, a newline and the owner of the first
// live one (entries past their deadline at the head are dropped first), so
// that only that waiter is woken. The common value (one hold, no
// lock-delay) is recognised by comparing it whole with the one the owner
// and token make, without parsing it.
var releaseSrc = `
local v = redis.pcall('GET', KEYS[1])
local f = ARGV[2]
local queued = ARGV[3] ~= '' and redis.call('EXISTS', KEYS[2]) == 1
if not queued and f ~= '0' and v == '1\n' .. f .. '\n\n\n' .. ARGV[1] then
  -- The common case (the one hold of a grant without lock-delay, whose
  -- key exists only while its lease is live, and no waiter queued): no
  -- clock to read, nothing to parse.
  redis.call('DEL', KEYS[1])
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], f) end
  return 0
end
` + queueClock + `
if f == '0' or v ~= '1\n' .. f .. '\n\n\n' .. ARGV[1] then
  -- Not the common case (the one hold of a grant without lock-delay,
  -- whose key exists only while its lease is live): parse the value.
  if type(v) ~= 'string' then return -1 end
  local c, e, d, o
  c, f, e, d, o = string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
  if not c or o ~= ARGV[1] or (ARGV[2] ~= '0' and f ~= ARGV[2]) or (e ~= '' and tonumber(e) <= now()) then
    return -1
  end
  local count = tonumber(c) - 1
  if count > 0 then
    local pttl = redis.call('PTTL', KEYS[1])
    redis.call('SET', KEYS[1], string.format('%.0f', count) .. '\n' .. f .. '\n' .. e .. '\n' .. d .. '\n' .. o, 'PX', math.max(pttl, 1))
    return count
  end
end
local msg = f
if queued then
  local head = dropDead(KEYS[2], KEYS[3], nil, nil)
  if head then msg = f .. '\n' .. head end
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], msg)
end
return 0
`

// enqueueSrc queues a waiter at a score the caller chose, or renews its
// entry's deadline (its place stays). Redlock waiters use one score (their
// first attempt's time) on every node, so that all nodes order them alike
// and grant to the same first waiter.
//
//	KEYS[1] queue, KEYS[2] queue deadlines
//	ARGV[1] owner, ARGV[2] score, ARGV[3] entry lifetime ms
var enqueueSrc = clock + `
local t = now()
local wait = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], t + wait)
redis.call('PEXPIRE', KEYS[1], wait)
redis.call('PEXPIRE', KEYS[2], wait)
return 1
`

// leaveSrc takes a waiter that gives up out of the queue.
//
//	KEYS[1] lock, KEYS[2] queue, KEYS[3] queue deadlines
//	ARGV[1] owner, ARGV[2] release channel
//
// When the lock is free and another waiter is now first, that waiter is
// woken ("0\nowner" on the channel): the leaving one may have been woken
// for it. Returns 1 if the owner was queued.
var leaveSrc = `
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[2] ~= '' and redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then redis.call('PUBLISH', ARGV[2], '0\n' .. head) end
end
return 1
`

// renewSrc extends many leases in one call.
//
//	KEYS[i] lock of lease i
//	ARGV[3i-2] owner, ARGV[3i-1] token ("0": do not check), ARGV[3i] TTL ms
//
// Returns one integer per key: 1 renewed, 0 not held (a key dlock did not
// write is not held). The lock-delay stored at grant time is kept (the key
// lives for TTL plus it again).
var renewSrc = prelude + `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local r = {}
for i = 1, #KEYS do
  local b = (i - 1) * 3
  r[i] = 0
  local st, c, f, e, d, o = read(KEYS[i])
  if st == 'ours' then
    if o == ARGV[b + 1] and (ARGV[b + 2] == '0' or f == ARGV[b + 2]) and live(e) then
      local ttl = tonumber(ARGV[b + 3])
      if e == '' then
        redis.call('PEXPIRE', KEYS[i], ttl)
      else
        redis.call('SET', KEYS[i], value(c, f, int(now() + ttl), d, o), 'PX', ttl + tonumber(d))
      end
      r[i] = 1
    end
  end
end
return r
`

// fenceSrc raises a fencing counter to at least a token (Redlock writes the
// token it chose back to the nodes) and records the token in the owner's
// lock.
//
//	KEYS[1] lock, KEYS[2] fence counter
//	ARGV[1] owner, ARGV[2] token
//
// Returns 1, or 0 without writing anything when a key dlock did not write
// is at the fence counter: the token is not recorded on this server.
var fenceSrc = prelude + `
local cur = counter(KEYS[2])
if not cur then return 0 end
if cur < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
local st, c, f, e, d, o = read(KEYS[1])
if st == 'ours' and o == ARGV[1] and f ~= ARGV[2] then
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('SET', KEYS[1], value(c, ARGV[2], e, d, o), 'PX', math.max(pttl, 1))
end
return 1
`

// dropSrc makes the server forget the current grant as if its lease had
// just expired: with a lock-delay the key stays for the delay, without one
// it goes. Nothing is published (an expiry is silent). The fencing counter
// is untouched, and so is a key dlock did not write. Returns 1 if there was
// a grant, 0 if not.
var dropSrc = prelude + `
local st, c, f, e, d, o = read(KEYS[1])
if st ~= 'ours' then return 0 end
if d ~= '' then
  redis.call('SET', KEYS[1], value(c, f, int(now()), d, o), 'PX', tonumber(d))
else
  redis.call('DEL', KEYS[1])
end
return 1
`

var (
	acquireEval   = newEvalScript(acquireSrc)
	releaseEval   = newEvalScript(releaseSrc)
	acquireScript = acquireEval.s
	releaseScript = releaseEval.s
	renewScript   = redis.NewScript(renewSrc)
	fenceScript   = redis.NewScript(fenceSrc)
	dropScript    = redis.NewScript(dropSrc)
	leaveScript   = redis.NewScript(leaveSrc)
	enqueueScript = redis.NewScript(enqueueSrc)
)

// Millis converts d to whole milliseconds, rounding up, at least 1.
func Millis(d time.Duration) int64 {
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	return ms
}

func delayMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return Millis(d)
}

// AcquireResult is the outcome of one Acquire on one server.
type AcquireResult struct {
	Granted bool
	Count   int    // hold count after a grant
	Fence   uint64 // the grant's token, or the holder's on a refusal (0 if Foreign)
	// PTTL is, on a refusal, the time until the key in the way expires
	// (lease + lock-delay); zero when it has no expiry (see NoExpiry).
	PTTL   time.Duration
	Holder string // refusal: the holder's owner; empty if Foreign
	// Foreign reports a refusal because a key dlock did not write is at
	// the lock key or the fencing counter: a lock held by an unknown owner.
	Foreign bool
	// NoExpiry reports a refusal by a key without a TTL: it is held until
	// somebody deletes it.
	NoExpiry bool
	// Queued reports a refusal of a free lock because another, live waiter
	// is first in its queue (PTTL, Fence and Holder are then zero).
	Queued bool
}

// Acquire runs the acquire script for one lock on one server, for a caller
// that does not wait: it is not queued, and is refused a free lock while
// a live waiter is queued for it.
func Acquire(ctx context.Context, c redis.Scripter, k Keys, owner string, ttl, delay time.Duration) (AcquireResult, error) {
	return AcquireQueued(ctx, c, k, owner, ttl, delay, 0)
}

// AcquireQueued is Acquire for a caller that waits: a refusal queues owner
// (or renews its entry) for wait, after which an entry not renewed is
// dropped. A release wakes the first waiter only (see Hub.SubscribeOwner);
// a refusal with Queued set means the lock is free but another waiter is
// first. wait 0 is Acquire.
func AcquireQueued(ctx context.Context, c redis.Scripter, k Keys, owner string, ttl, delay, wait time.Duration) (AcquireResult, error) {
	var w int64
	if wait > 0 {
		w = Millis(wait)
	}
	if p := processorOf(c); p != nil {
		args := append(evalArgs(4, 5), k.Lock, k.Fence, k.queue(), k.waits(), owner, Millis(ttl), delayMillis(delay), w, k.Channel)
		return runAcquire(acquireEval.run(ctx, p, args))
	}
	return runAcquire(acquireScript.Run(ctx, c, []string{k.Lock, k.Fence, k.queue(), k.waits()}, owner, Millis(ttl), delayMillis(delay), w, k.Channel))
}

// AcquireAtScore is AcquireQueued for a waiter whose queue score the
// caller chooses (ms by the caller's clock; ARGV[6] of the script) instead
// of the server's time: Redlock queues a waiter at one score on every node,
// so that all nodes order its waiters alike and grant to the same first one.
func AcquireAtScore(ctx context.Context, c redis.Scripter, k Keys, owner string, ttl, delay, wait time.Duration, score int64) (AcquireResult, error) {
	if p := processorOf(c); p != nil {
		args := append(evalArgs(4, 6), k.Lock, k.Fence, k.queue(), k.waits(), owner, Millis(ttl), delayMillis(delay), Millis(wait), k.Channel, score)
		return runAcquire(acquireEval.run(ctx, p, args))
	}
	return runAcquire(acquireScript.Run(ctx, c, []string{k.Lock, k.Fence, k.queue(), k.waits()}, owner, Millis(ttl), delayMillis(delay), Millis(wait), k.Channel, score))
}

// AcquireReply reads the reply of an acquire script that answers as the
// acquire script does (the token alone on a new grant, else an array; see
// parseAcquire): Redlock's waiting variant of the script uses it.
func AcquireReply(cmd *redis.Cmd) (AcquireResult, error) { return runAcquire(cmd) }

// runAcquire reads the acquire script's reply: one integer, the token of
// a new grant (hold count 1; an integer reply is cheaper for the server to
// write and for go-redis to read than an array), or an array (see
// parseAcquire).
func runAcquire(cmd *redis.Cmd) (AcquireResult, error) {
	v, err := cmd.Result()
	if err != nil {
		return AcquireResult{}, err
	}
	switch x := v.(type) {
	case int64:
		if x < 1 {
			return AcquireResult{}, fmt.Errorf("unexpected reply from acquire script: %d", x)
		}
		return AcquireResult{Granted: true, Count: 1, Fence: uint64(x)}, nil
	case []any:
		return parseAcquire(x)
	}
	return AcquireResult{}, fmt.Errorf("unexpected reply from acquire script: %T", v)
}

func parseAcquire(v []any) (AcquireResult, error) {
	if len(v) < 3 {
		return AcquireResult{}, fmt.Errorf("unexpected reply from acquire script: %v", v)
	}
	ok, err := toInt(v[0])
	if err != nil {
		return AcquireResult{}, err
	}
	fence, err := toUint(v[2])
	if err != nil {
		return AcquireResult{}, err
	}
	if ok == 1 {
		count, err := toInt(v[1])
		if err != nil {
			return AcquireResult{}, err
		}
		return AcquireResult{Granted: true, Count: int(count), Fence: fence}, nil
	}
	pttl, err := toInt(v[1])
	if err != nil {
		return AcquireResult{}, err
	}
	r := AcquireResult{Fence: fence}
	switch {
	case pttl > 0:
		r.PTTL = time.Duration(pttl) * time.Millisecond
	case pttl == -1:
		r.NoExpiry = true
	}
	if len(v) > 3 {
		r.Holder, _ = v[3].(string)
	}
	if len(v) > 4 {
		switch f, err := toInt(v[4]); {
		case err != nil:
		case f == 1:
			r.Foreign, r.Holder, r.Fence = true, "", 0
		case f == 2:
			r.Queued = true
		}
	}
	return r, nil
}

// Release runs the release script. held is false when owner (and token,
// unless zero) did not hold the lock; remaining is then meaningless. With
// k.Channel empty nothing is published.
func Release(ctx context.Context, c redis.Scripter, k Keys, owner string, token uint64) (remaining int, held bool, err error) {
	var cmd *redis.Cmd
	if p := processorOf(c); p != nil {
		args := append(evalArgs(3, 3), k.Lock, k.queue(), k.waits(), owner, token, k.Channel)
		cmd = releaseEval.run(ctx, p, args)
	} else {
		cmd = releaseScript.Run(ctx, c, k.releaseKeys(), owner, token, k.Channel)
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

// Leave takes owner out of k's waiter queue, waking the next waiter if the
// lock is free (see leaveSrc). A waiter that gives up calls it; an entry
// left behind (a crashed waiter, a failed Leave) is dropped once its
// deadline passes.
func Leave(ctx context.Context, c redis.Scripter, k Keys, owner string) error {
	return leaveScript.Run(ctx, c, k.releaseKeys(), owner, k.Channel).Err()
}

// Enqueue puts owner in k's waiter queue at score (its place: lower goes
// first, ties by owner), or renews its entry for wait if it is queued
// already (see enqueueSrc).
func Enqueue(ctx context.Context, c redis.Scripter, k Keys, owner string, score int64, wait time.Duration) error {
	return enqueueScript.Run(ctx, c, []string{k.queue(), k.waits()}, owner, score, Millis(wait)).Err()
}

// ErrForeignFence is returned by WriteFence when a key dlock did not write
// is at the fencing counter: the token could not be recorded there.
var ErrForeignFence = errors.New("the fencing counter key holds a value dlock did not write")

// WriteFence raises the fencing counter of k to at least token and records
// token in owner's lock. It fails with ErrForeignFence, writing nothing,
// when a key dlock did not write is at the counter.
func WriteFence(ctx context.Context, c redis.Scripter, k Keys, owner string, token uint64) error {
	n, err := fenceScript.Run(ctx, c, []string{k.Lock, k.Fence}, owner, strconv.FormatUint(token, 10)).Int64()
	if err != nil {
		return err
	}
	if n != 1 {
		return ErrForeignFence
	}
	return nil
}

// Drop makes the server forget the current grant of k as if it had
// expired (see dropSrc). It exists for tests and harnesses.
func Drop(ctx context.Context, c redis.Scripter, k Keys) (bool, error) {
	n, err := dropScript.Run(ctx, c, []string{k.Lock}).Int64()
	return n == 1, err
}

func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected value %T in script reply", v)
}

func toUint(v any) (uint64, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return 0, fmt.Errorf("negative fence %d in script reply", x)
		}
		return uint64(x), nil
	case string:
		return strconv.ParseUint(x, 10, 64)
	case nil:
		return 0, nil
	}
	return 0, fmt.Errorf("unexpected value %T in script reply", v)
}
