package redlock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/redisscript"
)

// waitSrc is redisscript's mutex acquire script (acquireSrc: same keys,
// same value format, same queue rules, same replies) for a waiter queued
// at a score of its own choosing, so that every node orders Redlock's
// waiters alike: a refusal queues the owner at ARGV[6] (a time by the
// waiter's clock, ms) rather than at the server's time, or renews its
// entry's deadline, in the same call. It runs only for waiting Locks that
// were refused once; a first attempt runs redisscript's script.
//
//	KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] queue deadlines
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms, ARGV[4] queue
//	entry lifetime ms, ARGV[5] release channel, ARGV[6] score
const waitSrc = `
local nowms
local function now()
  if not nowms then
    if redis.replicate_commands then pcall(redis.replicate_commands) end
    local t = redis.call('TIME')
    nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return nowms
end
local owner = ARGV[1]
local ttl = tonumber(ARGV[2])
local delay = tonumber(ARGV[3])
local wait = tonumber(ARGV[4])
local v = redis.pcall('GET', KEYS[1])
local c, f, e, d, o
if v then
  if type(v) == 'string' then
    c, f, e, d, o = string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
  end
  if c and o == owner and (e == '' or tonumber(e) > now()) then
    local ne, nd = '', ''
    if delay > 0 then
      ne, nd = string.format('%.0f', now() + ttl), ARGV[3]
    end
    local count = tonumber(c) + 1
    redis.call('SET', KEYS[1], string.format('%.0f', count) .. '\n' .. f .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    return {1, count, f}
  end
else
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head then
    local t = now()
    local purged = false
    while head and head ~= owner do
      local dl = redis.call('HGET', KEYS[4], head)
      if dl and tonumber(dl) > t then break end
      redis.call('ZREM', KEYS[3], head)
      redis.call('HDEL', KEYS[4], head)
      purged = true
      head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    end
    if head and head ~= owner then
      if purged and ARGV[5] ~= '' then
        redis.call('PUBLISH', ARGV[5], '0\n' .. head)
      end
      v = 'queued'
    end
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
    local fence = string.format('%.0f', n)
    redis.call('SET', KEYS[1], '1\n' .. fence .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    return {1, 1, fence}
  end
end
local t = now()
redis.call('ZADD', KEYS[3], 'NX', ARGV[6], owner)
redis.call('HSET', KEYS[4], owner, t + wait)
redis.call('PEXPIRE', KEYS[3], wait)
redis.call('PEXPIRE', KEYS[4], wait)
if v == 'queued' then
  return {0, 0, '0', '', 2}
end
if not c then
  return {0, redis.call('PTTL', KEYS[1]), '0', '', 1}
end
return {0, redis.call('PTTL', KEYS[1]), f, o, 0}
`

var waitScript = redis.NewScript(waitSrc)

// queueKeys returns the waiter queue and its deadlines of k.
func queueKeys(k redisscript.Keys) (queue, waits string) {
	queue, waits = k.Queue, k.Waits
	if queue == "" {
		queue = k.Lock + ":q"
	}
	if waits == "" {
		waits = k.Lock + ":qd"
	}
	return queue, waits
}

// acquireWaiting runs waitSrc for owner queued at score.
func acquireWaiting(ctx context.Context, c redis.Scripter, k redisscript.Keys, owner string, ttl, delay time.Duration, score int64) (redisscript.AcquireResult, error) {
	q, w := queueKeys(k)
	var dl int64
	if delay > 0 {
		dl = redisscript.Millis(delay)
	}
	v, err := waitScript.Run(ctx, c, []string{k.Lock, k.Fence, q, w}, owner, redisscript.Millis(ttl), dl, redisscript.Millis(queueWait), k.Channel, score).Slice()
	if err != nil {
		return redisscript.AcquireResult{}, err
	}
	return parseAcquire(v)
}

// parseAcquire reads an acquire script's reply (redisscript's format).
func parseAcquire(v []any) (redisscript.AcquireResult, error) {
	if len(v) < 3 {
		return redisscript.AcquireResult{}, fmt.Errorf("unexpected reply from acquire script: %v", v)
	}
	ok, err := toInt(v[0])
	if err != nil {
		return redisscript.AcquireResult{}, err
	}
	var fence uint64
	if v[2] != nil {
		f, err := toInt(v[2])
		if err != nil || f < 0 {
			return redisscript.AcquireResult{}, fmt.Errorf("bad fence %v in acquire reply: %v", v[2], err)
		}
		fence = uint64(f)
	}
	if ok == 1 {
		count, err := toInt(v[1])
		if err != nil {
			return redisscript.AcquireResult{}, err
		}
		return redisscript.AcquireResult{Granted: true, Count: int(count), Fence: fence}, nil
	}
	pttl, err := toInt(v[1])
	if err != nil {
		return redisscript.AcquireResult{}, err
	}
	r := redisscript.AcquireResult{Fence: fence}
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

func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("unexpected value %T in script reply", v)
}
