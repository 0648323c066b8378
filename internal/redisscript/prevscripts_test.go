package redisscript

// The acquire and release scripts of commit 4088ff6, before their fast
// paths were cut down to the fewest Lua operations, kept to measure the
// server time of the current ones against (BenchmarkFastPathServerTime).
var (
	prevAcquireSrc = clock + `
if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  -- The common case, a free lock nobody waits for: no queue to keep.
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
	prevReleaseSrc = clock + `
local v = redis.pcall('GET', KEYS[1])
local f = ARGV[2]
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
if ARGV[3] ~= '' then
  local head = redis.call('EXISTS', KEYS[2]) == 1 and redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    local t = now()
    while head do
      local dl = redis.call('HGET', KEYS[3], head)
      if dl and tonumber(dl) > t then break end
      redis.call('ZREM', KEYS[2], head)
      redis.call('HDEL', KEYS[3], head)
      head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    end
    if head then msg = f .. '\n' .. head end
  end
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], msg)
end
return 0
`
)
