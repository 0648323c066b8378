package redisscript

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// multiAcquireSrc takes several mutexes of one owner, all or none.
//
//	KEYS[4i-3..4i] lock, fence counter, queue and queue deadlines of name i
//	ARGV[1] owner, ARGV[2] TTL ms, ARGV[3] lock-delay ms
//
// It first checks every name as acquireSrc would for a caller that does
// not wait (held by another owner, in a lock-delay, a key dlock did not
// write at the lock or the counter, or a free lock with another live waiter
// first in its queue), without writing anything; the first name that
// refuses is returned as {0, i, pttl, fence, owner, code} with acquireSrc's
// codes. Otherwise it takes (or re-enters) every name and returns {1,
// count1, fence1, count2, fence2, ...}.
var multiAcquireSrc = clock + `
local owner, ttl, delay = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n = #KEYS / 4
local held = {}
local function parse(v)
  return string.match(v, '^(%d+)\n(%d+)\n(%d*)\n(%d*)\n(.*)$')
end
for i = 1, n do
  local b = (i - 1) * 4
  local v = redis.pcall('GET', KEYS[b + 1])
  if v then
    local c, f, e, d, o
    if type(v) == 'string' then c, f, e, d, o = parse(v) end
    if not c then return {0, i, redis.call('PTTL', KEYS[b + 1]), '0', '', 1} end
    if o ~= owner or (e ~= '' and tonumber(e) <= now()) then
      return {0, i, redis.call('PTTL', KEYS[b + 1]), f, o, 0}
    end
    held[i] = {c, f}
  else
    local fv = redis.pcall('GET', KEYS[b + 2])
    if fv and (type(fv) ~= 'string' or not string.match(fv, '^%d+$')) then
      return {0, i, redis.call('PTTL', KEYS[b + 2]), '0', '', 1}
    end
    local j = 0
    while true do
      local w = redis.call('ZRANGE', KEYS[b + 3], j, j)[1]
      if not w then break end
      local dl = redis.call('HGET', KEYS[b + 4], w)
      if dl and tonumber(dl) > now() then
        if w ~= owner then return {0, i, 0, '0', '', 2} end
        break
      end
      j = j + 1
    end
  end
end
local r = {1}
for i = 1, n do
  local b = (i - 1) * 4
  local ne, nd = '', ''
  if delay > 0 then ne, nd = string.format('%.0f', now() + ttl), ARGV[3] end
  local count, f = 1, nil
  if held[i] then
    count, f = tonumber(held[i][1]) + 1, held[i][2]
  else
    f = string.format('%.0f', redis.call('INCR', KEYS[b + 2]))
    redis.call('ZREM', KEYS[b + 3], owner)
    redis.call('HDEL', KEYS[b + 4], owner)
  end
  redis.call('SET', KEYS[b + 1], string.format('%.0f', count) .. '\n' .. f .. '\n' .. ne .. '\n' .. nd .. '\n' .. owner, 'PX', ttl + delay)
  r[#r + 1] = count
  r[#r + 1] = f
end
return r
`

var multiAcquireScript = redis.NewScript(multiAcquireSrc)

// MultiResult is the outcome of AcquireMulti.
type MultiResult struct {
	// Granted holds one AcquireResult per name when every name was taken.
	Granted []AcquireResult
	// Busy is, when nothing was taken, the index of the first name that
	// refused, and Refusal its refusal.
	Busy    int
	Refusal AcquireResult
}

// ErrCrossSlot is returned by AcquireMulti when the names' keys are in
// different Redis Cluster hash slots: one script cannot take them, and
// nothing was taken.
var ErrCrossSlot = fmt.Errorf("the names are in different Redis Cluster hash slots")

// AcquireMulti takes the mutexes of every key set in ks for owner in one
// script call, or none of them.
func AcquireMulti(ctx context.Context, c redis.Scripter, ks []Keys, owner string, ttl, delay time.Duration) (MultiResult, error) {
	keys := make([]string, 0, 4*len(ks))
	for _, k := range ks {
		keys = append(keys, k.Lock, k.Fence, k.queue(), k.waits())
	}
	v, err := multiAcquireScript.Run(ctx, c, keys, owner, Millis(ttl), delayMillis(delay)).Slice()
	if err != nil {
		if strings.HasPrefix(err.Error(), "CROSSSLOT") {
			return MultiResult{}, ErrCrossSlot
		}
		return MultiResult{}, err
	}
	if len(v) < 1 {
		return MultiResult{}, fmt.Errorf("unexpected reply from multi-acquire script: %v", v)
	}
	if ok, err := toInt(v[0]); err != nil {
		return MultiResult{}, err
	} else if ok == 0 {
		if len(v) < 6 {
			return MultiResult{}, fmt.Errorf("unexpected reply from multi-acquire script: %v", v)
		}
		i, err := toInt(v[1])
		if err != nil || i < 1 || int(i) > len(ks) {
			return MultiResult{}, fmt.Errorf("unexpected name index %v from multi-acquire script", v[1])
		}
		r, err := parseAcquire(append([]any{int64(0)}, v[2:]...))
		if err != nil {
			return MultiResult{}, err
		}
		return MultiResult{Busy: int(i) - 1, Refusal: r}, nil
	}
	if len(v) != 1+2*len(ks) {
		return MultiResult{}, fmt.Errorf("multi-acquire script returned %d values for %d names", len(v), len(ks))
	}
	out := make([]AcquireResult, len(ks))
	for i := range ks {
		count, err := toInt(v[1+2*i])
		if err != nil {
			return MultiResult{}, err
		}
		fence, err := toUint(v[2+2*i])
		if err != nil {
			return MultiResult{}, err
		}
		out[i] = AcquireResult{Granted: true, Count: int(count), Fence: fence}
	}
	return MultiResult{Granted: out}, nil
}
