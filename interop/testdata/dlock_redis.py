"""A minimal client of dlock's Redis layout, written from docs/protocol.md.

It takes part in dlock's own locks: the same keys, value format, fencing
counter, waiter queue and release channel. The interop tests drive it over
stdin/stdout, one command a line:

    try ID NAME OWNER TTL_MS      prints "ID got TOKEN" or "ID busy"
    lock ID NAME OWNER TTL_MS     prints "ID waiting", then "ID locked TOKEN"
    release ID                    prints "ID released" or "ID notheld"
    exit

Usage: python3 dlock_redis.py REDIS_URL [KEY_PREFIX]
"""

import base64
import sys
import threading

import redis

QUEUE_WAIT_MS = 3000  # a waiter's queue entry lifetime; renewed every third

# The clock, as the protocol gives it: TIME in ms, after replicate_commands.
CLOCK = """
local nowms
local function now()
  if not nowms then
    if redis.replicate_commands then pcall(redis.replicate_commands) end
    local t = redis.call('TIME')
    nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return nowms
end
local VALUE = '^(%d+)\\n(%d+)\\n(%d*)\\n(%d*)\\n(.*)$'
"""

# Acquire, steps 1-4 of "Acquire (one Lua script)".
ACQUIRE = CLOCK + """
local owner, ttl, delay, wait, channel = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local function fmt(n) return string.format('%.0f', n) end
local function fields()
  if delay > 0 then return fmt(now() + ttl), fmt(delay) end
  return '', ''
end
local v = redis.pcall('GET', KEYS[1])
local c, f, e, d, o
local code
if v then
  if type(v) == 'string' then c, f, e, d, o = string.match(v, VALUE) end
  if c and o == owner and (e == '' or tonumber(e) > now()) then
    local count = tonumber(c) + 1
    local ne, nd = fields()
    redis.call('SET', KEYS[1], fmt(count) .. '\\n' .. f .. '\\n' .. ne .. '\\n' .. nd .. '\\n' .. owner, 'PX', ttl + delay)
    return {1, count, f}
  end
  code = c and 0 or 1
else
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local dropped = false
  while head and head ~= owner do
    local dl = redis.call('HGET', KEYS[4], head)
    if dl and tonumber(dl) > now() then break end
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
    dropped = true
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
  if head and head ~= owner then
    if dropped then redis.call('PUBLISH', channel, '0\\n' .. head) end
    code = 2
  else
    local n = redis.pcall('INCR', KEYS[2])
    if type(n) ~= 'number' or n < 1 then
      if type(n) == 'number' then redis.call('DECR', KEYS[2]) end
      code = 1
    else
      redis.call('ZREM', KEYS[3], owner)
      redis.call('HDEL', KEYS[4], owner)
      local ne, nd = fields()
      redis.call('SET', KEYS[1], '1\\n' .. fmt(n) .. '\\n' .. ne .. '\\n' .. nd .. '\\n' .. owner, 'PX', ttl + delay)
      return {1, 1, fmt(n)}
    end
  end
end
if wait > 0 then
  redis.call('ZADD', KEYS[3], 'NX', now(), owner)
  redis.call('HSET', KEYS[4], owner, now() + wait)
  redis.call('PEXPIRE', KEYS[3], wait)
  redis.call('PEXPIRE', KEYS[4], wait)
end
if code == 2 then return {0, 0, '0', '', 2} end
if code == 1 and v then return {0, redis.call('PTTL', KEYS[1]), '0', '', 1} end
if code == 1 then return {0, redis.call('PTTL', KEYS[2]), '0', '', 1} end
return {0, redis.call('PTTL', KEYS[1]), f, o, 0}
"""

# Release, as "Release" says.
RELEASE = CLOCK + """
local owner, token, channel = ARGV[1], ARGV[2], ARGV[3]
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then return -1 end
local c, f, e, d, o = string.match(v, VALUE)
if not c or o ~= owner or (token ~= '0' and f ~= token) or (e ~= '' and tonumber(e) <= now()) then
  return -1
end
local count = tonumber(c) - 1
if count > 0 then
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('SET', KEYS[1], string.format('%.0f', count) .. '\\n' .. f .. '\\n' .. e .. '\\n' .. d .. '\\n' .. o, 'PX', math.max(pttl, 1))
  return count
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
while head do
  local dl = redis.call('HGET', KEYS[3], head)
  if dl and tonumber(dl) > now() then break end
  redis.call('ZREM', KEYS[2], head)
  redis.call('HDEL', KEYS[3], head)
  head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
end
redis.call('DEL', KEYS[1])
if head then redis.call('PUBLISH', channel, f .. '\\n' .. head) else redis.call('PUBLISH', channel, f) end
return 0
"""

# Leave, as "Leave" says.
LEAVE = """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then redis.call('PUBLISH', ARGV[2], '0\\n' .. head) end
end
return 1
"""


def keys(prefix, name):
    """The keys of "Keys": P{E}, fence, channel, queue, queue deadlines."""
    e = name
    if "{" in name or "}" in name or name.startswith("~"):
        e = "~" + base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")
    lock = prefix + "{" + e + "}"
    return lock, lock + ":fence", lock + ":rel", lock + ":q", lock + ":qd"


class Client:
    def __init__(self, url, prefix="dlock:"):
        self.r = redis.Redis.from_url(url)
        self.prefix = prefix
        self.acquire = self.r.register_script(ACQUIRE)
        self.release_script = self.r.register_script(RELEASE)
        self.leave = self.r.register_script(LEAVE)

    def try_lock(self, name, owner, ttl_ms, delay_ms=0, wait_ms=0):
        """One acquire: (token, None) on a grant, (None, retry_ms) if refused."""
        lock, fence, channel, q, qd = keys(self.prefix, name)
        r = self.acquire(keys=[lock, fence, q, qd], args=[owner, ttl_ms, delay_ms, wait_ms, channel])
        if r[0] == 1:
            return int(r[2]), None
        return None, int(r[1])

    def lock(self, name, owner, ttl_ms, delay_ms=0):
        """Waits in the queue; woken by the release channel (see "Wake-up")."""
        lock, fence, channel, q, qd = keys(self.prefix, name)
        ps = self.r.pubsub(ignore_subscribe_messages=True)
        ps.subscribe(channel)
        try:
            while True:
                token, retry = self.try_lock(name, owner, ttl_ms, delay_ms, QUEUE_WAIT_MS)
                if token is not None:
                    return token
                wait_ms = QUEUE_WAIT_MS / 3
                if retry > 0:
                    wait_ms = min(wait_ms, retry + 1)
                msg = ps.get_message(timeout=wait_ms / 1000.0)
                while msg is not None:  # drain: any message means "try now"
                    msg = ps.get_message(timeout=0)
        except BaseException:
            self.leave(keys=[lock, q, qd], args=[owner, channel])
            raise
        finally:
            ps.close()

    def release(self, name, owner, token):
        lock, fence, channel, q, qd = keys(self.prefix, name)
        return self.release_script(keys=[lock, q, qd], args=[owner, str(token), channel])


def say(s):
    with _out:
        print(s, flush=True)


_out = threading.Lock()


def main():
    c = Client(sys.argv[1], *(sys.argv[2:3]))
    held = {}
    say("ready")
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        if f[0] == "exit":
            break
        cmd, lid = f[0], f[1]
        if cmd == "try":
            name, owner, ttl = f[2], f[3], int(f[4])
            token, _ = c.try_lock(name, owner, ttl)
            if token is None:
                say(lid + " busy")
            else:
                held[lid] = (name, owner, token)
                say("%s got %d" % (lid, token))
        elif cmd == "lock":
            name, owner, ttl = f[2], f[3], int(f[4])

            def run(lid=lid, name=name, owner=owner, ttl=ttl):
                say(lid + " waiting")
                token = c.lock(name, owner, ttl)
                held[lid] = (name, owner, token)
                say("%s locked %d" % (lid, token))

            threading.Thread(target=run, daemon=True).start()
        elif cmd == "release":
            name, owner, token = held.pop(lid)
            n = c.release(name, owner, token)
            say(lid + (" released" if n >= 0 else " notheld"))
        else:
            say("error unknown command " + cmd)


if __name__ == "__main__":
    main()
