package redisscript

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A lock's value is one string, so that a grant is one SET ... PX and a
// check one GET (cheaper on the server than a hash):
//
//	count \n token \n exp \n delay \n owner
//
// exp (the lease's own expiry, server ms) and delay (ms) are empty without a
// lock-delay: the key's PX expiry is then the lease's, and a key that exists
// is a live lease. The owner comes last, so it may contain any byte.
//
// Scripts read the server's clock (TIME) only when a lock-delay is
// involved, and always before their first write, after calling
// redis.replicate_commands: that lets them write after TIME on servers older
// than 5.0 (later servers replicate scripts by effects and treat the call as
// a no-op).
const prelude = `
local nowms
local function now()
  if not nowms then
    if redis.replicate_commands then pcall(redis.replicate_commands) end
    local t = redis.call('TIME')
    nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return nowms
end
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
`

// acquireSrc grants, re-enters or refuses a lock.
//
//	KEYS[1] lock, KEYS[2] fence counter
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms
//
// The key lives for TTL + lock-delay (PX). With a lock-delay, between exp
// and the key's expiry the lock is in its lock-delay: the key still exists,
// so nobody can take it, but it is no longer held, so its owner can neither
// renew, re-enter nor release it. Returns {1, count, fence} on a grant,
// {0, pttl, fence, owner} on a refusal.
var acquireSrc = prelude + `
local ttl = tonumber(ARGV[2])
local delay = tonumber(ARGV[3])
local v = redis.call('GET', KEYS[1])
local count, fence
if v then
  local c, f, e, d, o = parse(v)
  if o ~= ARGV[1] or not live(e) then
    return {0, redis.call('PTTL', KEYS[1]), f, o}
  end
  count, fence = tonumber(c) + 1, f
end
local e, d = '', ''
if delay > 0 then
  e, d = int(now() + ttl), ARGV[3]
end
if not v then
  count, fence = 1, int(redis.call('INCR', KEYS[2]))
end
redis.call('SET', KEYS[1], value(count, fence, e, d, ARGV[1]), 'PX', ttl + delay)
return {1, count, fence}
`

// releaseSrc gives up one hold.
//
//	KEYS[1] lock
//	ARGV[1] owner, ARGV[2] token ("0": do not check), ARGV[3] release channel
//	("": publish nothing)
//
// Returns the remaining hold count, or -1 when the owner does not hold the
// lock (absent, another owner, another grant, or past its lease expiry). The
// last hold deletes the key at once (no lock-delay) and publishes the
// grant's token on the release channel.
var releaseSrc = prelude + `
local v = redis.call('GET', KEYS[1])
if not v then return -1 end
local c, f, e, d, o = parse(v)
if o ~= ARGV[1] or (ARGV[2] ~= '0' and f ~= ARGV[2]) or not live(e) then
  return -1
end
local count = tonumber(c) - 1
if count > 0 then
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('SET', KEYS[1], value(count, f, e, d, o), 'PX', math.max(pttl, 1))
  return count
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], f)
end
return 0
`

// renewSrc extends many leases in one call.
//
//	KEYS[i] lock of lease i
//	ARGV[3i-2] owner, ARGV[3i-1] token ("0": do not check), ARGV[3i] TTL ms
//
// Returns one integer per key: 1 renewed, 0 not held. The lock-delay stored
// at grant time is kept (the key lives for TTL plus it again).
var renewSrc = prelude + `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local r = {}
for i = 1, #KEYS do
  local b = (i - 1) * 3
  r[i] = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local c, f, e, d, o = parse(v)
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
var fenceSrc = prelude + `
local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
local v = redis.call('GET', KEYS[1])
if v then
  local c, f, e, d, o = parse(v)
  if o == ARGV[1] and f ~= ARGV[2] then
    local pttl = redis.call('PTTL', KEYS[1])
    redis.call('SET', KEYS[1], value(c, ARGV[2], e, d, o), 'PX', math.max(pttl, 1))
  end
end
return 1
`

// dropSrc makes the server forget the current grant as if its lease had
// just expired: with a lock-delay the key stays for the delay, without one
// it goes. Nothing is published (an expiry is silent). The fencing counter
// is untouched. Returns 1 if there was a grant, 0 if not.
var dropSrc = prelude + `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local c, f, e, d, o = parse(v)
if d ~= '' then
  redis.call('SET', KEYS[1], value(c, f, int(now()), d, o), 'PX', tonumber(d))
else
  redis.call('DEL', KEYS[1])
end
return 1
`

var (
	acquireScript = redis.NewScript(acquireSrc)
	releaseScript = redis.NewScript(releaseSrc)
	renewScript   = redis.NewScript(renewSrc)
	fenceScript   = redis.NewScript(fenceSrc)
	dropScript    = redis.NewScript(dropSrc)
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
	Count   int           // hold count after a grant
	Fence   uint64        // the grant's token, or the holder's on a refusal
	PTTL    time.Duration // refusal: time until the key expires (lease + lock-delay)
	Holder  string        // refusal: the holder's owner
}

// Acquire runs the acquire script for one lock on one server.
func Acquire(ctx context.Context, c redis.Scripter, k Keys, owner string, ttl, delay time.Duration) (AcquireResult, error) {
	v, err := acquireScript.Run(ctx, c, []string{k.Lock, k.Fence}, owner, Millis(ttl), delayMillis(delay)).Slice()
	if err != nil {
		return AcquireResult{}, err
	}
	return parseAcquire(v)
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
	if pttl > 0 {
		r.PTTL = time.Duration(pttl) * time.Millisecond
	}
	if len(v) > 3 {
		r.Holder, _ = v[3].(string)
	}
	return r, nil
}

// Release runs the release script. held is false when owner (and token,
// unless zero) did not hold the lock; remaining is then meaningless. With
// k.Channel empty nothing is published.
func Release(ctx context.Context, c redis.Scripter, k Keys, owner string, token uint64) (remaining int, held bool, err error) {
	n, err := releaseScript.Run(ctx, c, []string{k.Lock}, owner, strconv.FormatUint(token, 10), k.Channel).Int64()
	if err != nil {
		return 0, false, err
	}
	if n < 0 {
		return 0, false, nil
	}
	return int(n), true, nil
}

// WriteFence raises the fencing counter of k to at least token and records
// token in owner's lock.
func WriteFence(ctx context.Context, c redis.Scripter, k Keys, owner string, token uint64) error {
	return fenceScript.Run(ctx, c, []string{k.Lock, k.Fence}, owner, strconv.FormatUint(token, 10)).Err()
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
