package redisscript

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Grant-in-release (docs/protocol.md, "Grant-in-release"): variants of
// three of the mutex scripts with which a release hands a freed lock to the
// first queued waiter at once, instead of waking it to ask again: a
// waiting acquire that marks the waiter as one a release may grant the
// lock to and adopts such a grant, a release that grants the lock to a
// marked, listening queue head, and a leave that drops the mark. Redlock
// runs them on each node; redislock on its one server. They keep the
// layout above and add one hash beside the queue:
//
//	P{E}:qg  owner → "ttl_ms\ndelay_ms\nchannel" (a grant request: the
//	         waiter's lease and the channel its driver listens on), or
//	         "=token" (a release granted the owner that grant, not yet
//	         adopted by one of its attempts)
//
// A client that does not know the hash (an older dlock, or a client
// written from the protocol without it) never writes it: its waiters are
// woken as before, never granted; its releases wake a waiter that asked
// for a grant instead of granting it.

// waitAcquireSrc is the acquire script for a queued waiter (ARGV[6], the
// score, may be "": the server's time), with three changes. A refusal
// records the waiter's grant request in qg (ARGV[7] is its driver's grant
// channel). A live grant of this owner whose qg record is "=token" (a
// release granted it to this waiter) is adopted: the hold count stays 1,
// the token is a new one from the counter (INCR, as a new grant now would
// get), the lease is set afresh (PX ttl + delay from now), the record
// goes, and the reply is that of a new grant (the token alone). A
// refusal's reply has a sixth element, the node's fencing counter as it
// was (decimal string, "0" when missing or not an integer).
//
//	KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] queue deadlines, KEYS[5] qg
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms, ARGV[4] queue
//	entry lifetime ms, ARGV[5] release channel, ARGV[6] score, ARGV[7]
//	grant channel
var waitAcquireSrc = queueClock + readHeld + `
local function lease()
  if delay > 0 then return string.format('%.0f', now() + ttl), ARGV[3] end
  return '', ''
end
if v then
  if mine then
    local ne, nd = lease()
    local count = tonumber(c)
    if redis.call('HGET', KEYS[5], owner) == '=' .. f then
      -- Adopted with a new token, as a new grant now would get.
      local n = redis.pcall('INCR', KEYS[2])
      if type(n) == 'number' and n >= 1 then
        f = string.format('%.0f', n)
      elseif type(n) == 'number' then
        redis.call('DECR', KEYS[2])
      end
      redis.call('HDEL', KEYS[5], owner)
      redis.call('ZREM', KEYS[3], owner)
      redis.call('HDEL', KEYS[4], owner)
    else
      count = count + 1
    end
    redis.call('SET', KEYS[1], string.format('%.0f', count) .. '\n' .. f .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    if count == 1 then return tonumber(f) end
    return {1, count, f}
  end
else
  local head, purged = dropDead(KEYS[3], KEYS[4], KEYS[5], owner)
  if head and head ~= owner then
    if purged then
      redis.call('PUBLISH', ARGV[5], '0\n' .. head)
    end
    v = 'queued'
  end
  if not v then
    local ne, nd = lease()
    local n = redis.pcall('INCR', KEYS[2])
    if type(n) ~= 'number' or n < 1 then
      if type(n) == 'number' then redis.call('DECR', KEYS[2]) end
      return {0, redis.call('PTTL', KEYS[2]), '0', '', 1, '0'}
    end
    redis.call('ZREM', KEYS[3], owner)
    redis.call('HDEL', KEYS[4], owner)
    redis.call('HDEL', KEYS[5], owner)
    redis.call('SET', KEYS[1], '1\n' .. string.format('%.0f', n) .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
    return n
  end
end
local t = now()
redis.call('ZADD', KEYS[3], 'NX', ARGV[6] ~= '' and ARGV[6] or t, owner)
redis.call('HSET', KEYS[4], owner, t + wait)
redis.call('HSET', KEYS[5], owner, ARGV[2] .. '\n' .. ARGV[3] .. '\n' .. ARGV[7])
redis.call('PEXPIRE', KEYS[3], wait)
redis.call('PEXPIRE', KEYS[4], wait)
if redis.call('PTTL', KEYS[5]) < wait then redis.call('PEXPIRE', KEYS[5], wait) end
local cnt = redis.pcall('GET', KEYS[2])
if type(cnt) ~= 'string' or not string.match(cnt, '^%d+$') then cnt = '0' end
if v == 'queued' then
  return {0, 0, '0', '', 2, cnt}
end
if not c then
  return {0, redis.call('PTTL', KEYS[1]), '0', '', 1, cnt}
end
return {0, redis.call('PTTL', KEYS[1]), f, o, 0, cnt}
`

// grantReleaseSrc is the release script (same keys first, same
// replies) that, when it frees the lock and the first live waiter of the
// queue has a grant request in qg whose grant channel has a subscriber on
// this server (PUBSUB NUMSUB: the waiter's driver is connected here),
// grants the lock to that waiter at once instead of waking it: it raises
// the fencing counter by one (INCR: the new token, as an acquire's), sets
// the lock to the waiter's grant "1\ntoken\nexp\ndelay\nowner" with PX
// ttl + delay from the request, takes the waiter out of the queue, records
// "=token" for it in qg, and publishes "token\nowner\nreleased
// token\nreleasing owner\nrelease channel" on the waiter's grant channel.
// A grant message is published only for a grant that is kept: PUBLISH
// reaches the server's replicas and, in a cluster, every node, so the
// message of a grant undone after a PUBLISH that counted no local
// subscriber could still reach the waiter through another server. Without
// a listening request (or when the counter is not dlock's) it does what
// the plain release does: delete and publish "token\nhead" on the release
// channel. Releasing also drops the releasing owner's own qg record; an
// owner that does not hold the lock (reply -1) leaves the queue if it is
// in it (on Redlock, its lease was granted by a quorum of other nodes
// before this one's grant).
//
// When the lock is freed, one EXISTS of the queue, qg and the queue again
// tells both at once (EXISTS counts a key named twice twice: 2 × queue +
// qg): the queue is read only if it exists (on a free lock's release, a
// ZRANGE of the missing key costs more than the EXISTS), and the owner's
// qg field is dropped (HDEL) only if qg exists. The common case (the one
// hold of a grant without lock-delay, whose key exists only while its
// lease is live, and neither a queue nor qg) is recognised before the
// clock prelude and the notHeld closure: the value is compared whole with
// the one the owner and the token make (read from the value with one
// anchored match when ARGV[2] is "0", as Release passes it), and the
// EXISTS answering 0 leaves only DEL and PUBLISH. qg must be missing too,
// not just the queue: a release that grants the lock to the last waiter
// empties the queue and leaves the waiter's "=token" record in qg (an
// attempt adopting the grant drops it, but a waiter that holds on a quorum
// of grant messages never adopts), which that waiter's release drops.
//
//	KEYS[1] lock, KEYS[2] queue, KEYS[3] queue deadlines, KEYS[4] fence
//	ARGV[1] owner, ARGV[2] token ("0": do not check), ARGV[3] release channel
//
// The qg hash is not passed: it is KEYS[2] .. "g", in the queue's hash
// slot (a Redis Cluster node runs a script's commands on undeclared keys of
// the declared keys' slot); passing it would cost every uncontended release
// an allocation.
var grantReleaseSrc = `
local v = redis.pcall('GET', KEYS[1])
local f = ARGV[2]
if f == '0' and type(v) == 'string' then f = string.match(v, '^1\n(%d+)\n\n\n') end
-- x: 2 × (the queue exists) + (qg exists), once the lock is freed.
local x = f and v == '1\n' .. f .. '\n\n\n' .. ARGV[1] and redis.call('EXISTS', KEYS[2], KEYS[2] .. 'g', KEYS[2])
if x == 0 then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], f)
  return 0
end
` + queueClock + `
local QG = KEYS[2] .. 'g'
-- notHeld: the owner does not hold the lock here; if it is still queued
-- (a grant on a quorum of other nodes came first), it leaves the queue.
local function notHeld()
  if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[1])
    redis.call('HDEL', QG, ARGV[1])
  end
  return -1
end
if not x then
  -- Not the common value: parse it.
  if type(v) ~= 'string' then return notHeld() end
  local c, e, d, o
  c, f, e, d, o = string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
  if not c or o ~= ARGV[1] or (ARGV[2] ~= '0' and f ~= ARGV[2]) or (e ~= '' and tonumber(e) <= now()) then
    return notHeld()
  end
  local count = tonumber(c) - 1
  if count > 0 then
    local pttl = redis.call('PTTL', KEYS[1])
    redis.call('SET', KEYS[1], string.format('%.0f', count) .. '\n' .. f .. '\n' .. e .. '\n' .. d .. '\n' .. o, 'PX', math.max(pttl, 1))
    return count
  end
  x = redis.call('EXISTS', KEYS[2], QG, KEYS[2])
end
local msg = f
if x % 2 == 1 then redis.call('HDEL', QG, ARGV[1]) end
local head = x >= 2 and dropDead(KEYS[2], KEYS[3], QG, nil)
if head then
  local t = now()
  local g = redis.call('HGET', QG, head)
  local gttl, gdelay, gch
  if g then gttl, gdelay, gch = string.match(g, '^(%d+)\n(%d+)\n(.+)$') end
  -- Only a waiter whose driver listens here is granted: a grant
  -- message is published only for a grant that is kept (a PUBLISH
  -- reaches the server's replicas and, in a cluster, every node, so a
  -- message of a grant undone for want of a local subscriber could
  -- still be heard).
  if gttl and redis.call('PUBSUB', 'NUMSUB', gch)[2] == 0 then gttl = nil end
  -- The new token: the counter + 1 (INCR; a counter dlock did not
  -- write, or a write refused (OOM), makes no grant).
  local n = gttl and redis.pcall('INCR', KEYS[4])
  if type(n) == 'number' and n < 1 then
    redis.call('DECR', KEYS[4])
    n = nil
  end
  if type(n) == 'number' then
    local tok = string.format('%.0f', n)
    local ttl, delay = tonumber(gttl), tonumber(gdelay)
    local ne, nd = '', ''
    if delay > 0 then ne, nd = string.format('%.0f', t + ttl), gdelay end
    -- The grant is written before it is announced: the writes after
    -- the INCR are not refused.
    redis.call('SET', KEYS[1], '1\n' .. tok .. '\n' .. ne .. '\n' .. nd .. '\n' .. head, 'PX', ttl + delay)
    redis.call('ZREM', KEYS[2], head)
    redis.call('HDEL', KEYS[3], head)
    redis.call('HSET', QG, head, '=' .. tok)
    if redis.call('PTTL', QG) < ttl + delay then redis.call('PEXPIRE', QG, ttl + delay) end
    redis.call('PUBLISH', gch, tok .. '\n' .. head .. '\n' .. f .. '\n' .. ARGV[1] .. '\n' .. ARGV[3])
    return 0
  end
  msg = f .. '\n' .. head
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], msg)
return 0
`

// leaveGrantSrc is the leave script that also drops the
// owner's qg record.
//
//	KEYS[1] lock, KEYS[2] queue, KEYS[3] queue deadlines, KEYS[4] qg
//	ARGV[1] owner, ARGV[2] release channel
var leaveGrantSrc = `
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then redis.call('PUBLISH', ARGV[2], '0\n' .. head) end
end
return 1
`

var (
	waitAcquireEval  = newEvalScript(waitAcquireSrc)
	grantReleaseEval = newEvalScript(grantReleaseSrc)
	leaveGrantScript = redis.NewScript(leaveGrantSrc)
)

// WaitAcquireSrc, GrantReleaseSrc and LeaveGrantSrc are the scripts'
// sources, for tests that load or probe them.
var (
	WaitAcquireSrc  = waitAcquireSrc
	GrantReleaseSrc = grantReleaseSrc
	LeaveGrantSrc   = leaveGrantSrc
)

// GrantsKey is the qg hash of the lock whose keys are k.
func GrantsKey(k Keys) string { return k.queue() + "g" }

// AcquireWaiting runs the waiting acquire for a queued waiter at score
// (ms; 0: the server's time when it is first queued) whose driver listens
// for grants on grantCh, its queue entry lasting wait unless renewed. A
// refusal records the waiter's grant request; a grant a release made for
// it is adopted with a fresh token. For a refusal it also returns the
// server's fencing counter as the script saw it.
func AcquireWaiting(ctx context.Context, c redis.Scripter, k Keys, owner string, ttl, delay, wait time.Duration, score int64, grantCh string) (AcquireResult, uint64, error) {
	var sc any = ""
	if score != 0 {
		sc = score
	}
	var cmd *redis.Cmd
	if p := processorOf(c); p != nil {
		args := append(evalArgs(5, 7), k.Lock, k.Fence, k.queue(), k.waits(), GrantsKey(k), owner, Millis(ttl), delayMillis(delay), Millis(wait), k.Channel, sc, grantCh)
		cmd = waitAcquireEval.run(ctx, p, args)
	} else {
		cmd = waitAcquireEval.s.Run(ctx, c, []string{k.Lock, k.Fence, k.queue(), k.waits(), GrantsKey(k)}, owner, Millis(ttl), delayMillis(delay), Millis(wait), k.Channel, sc, grantCh)
	}
	r, err := runAcquire(cmd)
	if err != nil || r.Granted {
		return r, 0, err
	}
	var counter uint64
	if v, ok := cmd.Val().([]any); ok && len(v) > 5 {
		if s, ok := v[5].(string); ok {
			counter, _ = strconv.ParseUint(s, 10, 64)
		}
	}
	return r, counter, nil
}

// ReleaseGranting runs the granting release: one hold of owner's grant
// (token 0: any token) is released; a freed lock goes to the first queued
// waiter that asked for grants and is listening, or wakes it. held is
// false when owner did not hold the lock. With k.Channel empty the release
// publishes nothing and grants nothing (see Release).
func ReleaseGranting(ctx context.Context, c redis.Scripter, k Keys, owner string, token uint64) (remaining int, held bool, err error) {
	if k.Channel == "" {
		return Release(ctx, c, k, owner, token)
	}
	var cmd *redis.Cmd
	if p := processorOf(c); p != nil {
		args := append(evalArgs(4, 3), k.Lock, k.queue(), k.waits(), k.Fence, owner, token, k.Channel)
		cmd = grantReleaseEval.run(ctx, p, args)
	} else {
		cmd = grantReleaseEval.s.Run(ctx, c, []string{k.Lock, k.queue(), k.waits(), k.Fence}, owner, token, k.Channel)
	}
	n, err := cmd.Int64()
	if err != nil || n < 0 {
		return 0, false, err
	}
	return int(n), true, nil
}

// LeaveGranting takes owner out of k's queue and drops its qg record (a
// waiter that asked for grants and gives up).
func LeaveGranting(ctx context.Context, c redis.Scripter, k Keys, owner string) error {
	return leaveGrantScript.Run(ctx, c, []string{k.Lock, k.queue(), k.waits(), GrantsKey(k)}, owner, k.Channel).Err()
}

// NewGrantChannel is a driver's grant channel: the key prefix, "grant:"
// and 128 random bits in hex, so that no two drivers share one.
func NewGrantChannel(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + "grant:" + hex.EncodeToString(b[:])
}

// GrantMessage is a grant the granting release published on a waiter's
// grant channel.
type GrantMessage struct {
	Token   uint64 // the grant's token
	Owner   string // the waiter granted
	From    string // the owner whose release made the grant
	FromTok uint64 // the released grant's token
	Channel string // the lock's release channel
}

// ParseGrantMessage reads a grant message "token\nowner\nreleased
// token\nreleasing owner\nrelease channel"; ok is false for anything else.
func ParseGrantMessage(payload string) (m GrantMessage, ok bool) {
	f := strings.SplitN(payload, "\n", 5)
	if len(f) != 5 {
		return m, false
	}
	token, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil || token == 0 {
		return m, false
	}
	rel, _ := strconv.ParseUint(f[2], 10, 64)
	return GrantMessage{Token: token, Owner: f[1], From: f[3], FromTok: rel, Channel: f[4]}, true
}

// KeysOfChannel returns the dlock-layout mutex keys whose release channel
// is channel.
func KeysOfChannel(channel string) (Keys, bool) {
	base, ok := strings.CutSuffix(channel, ":rel")
	if !ok {
		return Keys{}, false
	}
	return Keys{Lock: base, Fence: base + ":fence", Channel: channel, Queue: base + ":q", Waits: base + ":qd"}, true
}
