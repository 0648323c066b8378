package redisscript

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
)

// ForeignOwner is the Owner that status output shows for a lock held by a
// key dlock did not write (see NodeLock.Foreign).
const ForeignOwner = "?"

// NodeLock is one lock as one server sees it.
type NodeLock struct {
	Name  string
	Owner string // empty when free or Foreign
	Count int
	Fence uint64 // the highest token this server knows for the name
	// PTTL is the time until the key expires by itself: the lease plus any
	// lock-delay. Zero when free; negative when Foreign and the key has no
	// expiry (held until somebody deletes it).
	PTTL time.Duration
	// Foreign reports that a key dlock did not write (another client's
	// string, a hash, a list, ...) is at the lock key, or at the fencing
	// counter of a name whose lock key is free: the name is held by an
	// unknown owner, and Count is 1.
	Foreign bool
	// Waiters is the number of entries in the lock's waiter queue (an
	// entry whose waiter vanished counts until it is dropped, at most a
	// few seconds later); for a read/write lock, the live waiting writer
	// marks.
	Waiters int
	// Kind is Exclusive for a mutex, Write for a read/write lock, Permit
	// for a semaphore. For the last two, Owner and Count are the writer's
	// (or Count the readers' and holders' holds together), PTTL is until
	// the last place ends, and:
	Kind    driver.Kind
	Readers int // live readers
	Permits int // the semaphore's stored permit count (0 when free)
	Holders int // live permit holders
}

// inspectKindSrc reads a read/write lock (ARGV[1] "rw"; KEYS writer,
// readers, readers hash, marks, fence) or a semaphore (ARGV[1] "p"; KEYS
// holders, holders hash, fence) without changing it. Returns {writer value
// or false, writer PTTL, live holders, their holds, ms until the last place
// ends, live marks, fence counter or false, permits}.
var inspectKindSrc = kindPrelude + `
local t = now()
local w, wpttl, z, h, m, fk = false, 0, KEYS[1], KEYS[2], nil, KEYS[3]
if ARGV[1] == 'rw' then
  w = redis.pcall('GET', KEYS[1])
  if type(w) ~= 'string' then w = false end
  if w then wpttl = redis.call('PTTL', KEYS[1]) end
  z, h, m, fk = KEYS[2], KEYS[3], KEYS[4], KEYS[5]
end
local live, holds, last, marks, permits = 0, 0, 0, 0, 0
if typed(z, 'zset') and typed(h, 'hash') then
  local all = redis.call('ZRANGEBYSCORE', z, '(' .. t, '+inf', 'WITHSCORES')
  for i = 1, #all, 2 do
    last = math.max(last, tonumber(all[i + 1]) - t)
    local c, f, e = hparse(redis.call('HGET', h, all[i]) or '')
    if c and tonumber(e) > t then
      live = live + 1
      holds = holds + tonumber(c)
    end
  end
  if #all > 0 then permits = tonumber(redis.call('HGET', h, '') or '0') or 0 end
end
if m and typed(m, 'zset') then marks = redis.call('ZCOUNT', m, '(' .. t, '+inf') end
local fv = redis.pcall('GET', fk)
if type(fv) ~= 'string' then fv = false end
return {w, wpttl, live, holds, last, marks, fv, permits}
`

var inspectKindScript = redis.NewScript(inspectKindSrc)

// Inspect lists the locks under keyPrefix on the server(s) behind c whose
// names start with namePrefix, sorted by name: every name with a lock key
// or a fencing counter (a free lock that was once taken has a counter).
func Inspect(ctx context.Context, c redis.UniversalClient, keyPrefix, namePrefix string) ([]NodeLock, error) {
	pattern := keyPrefix + "{*"
	var (
		mu    sync.Mutex
		names = map[string]bool{}
		kinds = map[nameKind]bool{}
	)
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			if name, _, ok := NameFromKey(keyPrefix, it.Val()); ok && strings.HasPrefix(name, namePrefix) {
				mu.Lock()
				names[name] = true
				mu.Unlock()
			} else if name, k, ok := KindFromKey(keyPrefix, it.Val()); ok && strings.HasPrefix(name, namePrefix) {
				mu.Lock()
				kinds[nameKind{name, k}] = true
				mu.Unlock()
			}
		}
		return it.Err()
	}
	if err := forEachNode(ctx, c, scan); err != nil {
		return nil, err
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	kindLocks, err := inspectKinds(ctx, c, keyPrefix, kinds)
	if err != nil {
		return nil, err
	}
	out, err := readLocks(ctx, c, sorted, func(n string) Keys { return KeysFor(keyPrefix, n) })
	if err != nil {
		return nil, err
	}
	out = append(out, kindLocks...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out, nil
}

// InspectPlain is Inspect for the plain layout (see PlainKeysFor): the
// locks whose key is keyPrefix + name, with a name starting with
// namePrefix, that have a fencing counter beside them (every lock dlock
// ever granted there; a lock only foreign clients ever took is not known).
// A key that dlock did not write at such a lock is a Foreign holder.
func InspectPlain(ctx context.Context, c redis.UniversalClient, keyPrefix, namePrefix string) ([]NodeLock, error) {
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, "*:fence", 1000).Iterator()
		for it.Next(ctx) {
			key, ok := PlainKeyFromFence(it.Val())
			if !ok {
				continue
			}
			if name, ok := strings.CutPrefix(key, keyPrefix); ok && strings.HasPrefix(name, namePrefix) {
				mu.Lock()
				names[name] = true
				mu.Unlock()
			}
		}
		return it.Err()
	}
	if err := forEachNode(ctx, c, scan); err != nil {
		return nil, err
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	return readLocks(ctx, c, sorted, func(n string) Keys {
		k, _ := PlainKeysFor(keyPrefix + n)
		return k
	})
}

// forEachNode runs scan on every primary behind c.
func forEachNode(ctx context.Context, c redis.UniversalClient, scan func(context.Context, redis.UniversalClient) error) error {
	switch cc := c.(type) {
	case *redis.ClusterClient:
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	case *redis.Ring:
		return cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	}
	return scan(ctx, c)
}

// readLocks reads the mutexes of names (sorted), whose keys keys gives.
func readLocks(ctx context.Context, c redis.UniversalClient, sorted []string, keys func(string) Keys) ([]NodeLock, error) {
	if len(sorted) == 0 {
		return nil, nil
	}
	type q struct {
		v, fence       *redis.StringCmd
		pttl, fencePTT *redis.DurationCmd
		waiters        *redis.IntCmd
	}
	qs := make([]q, len(sorted))
	pipe := c.Pipeline()
	for i, n := range sorted {
		k := keys(n)
		qs[i] = q{
			v:        pipe.Get(ctx, k.Lock),
			pttl:     pipe.PTTL(ctx, k.Lock),
			fence:    pipe.Get(ctx, k.Fence),
			fencePTT: pipe.PTTL(ctx, k.Fence),
			waiters:  pipe.ZCard(ctx, k.Queue),
		}
	}
	// A GET of a key of another type fails alone (WRONGTYPE); only errors
	// that are not the server's answer about one key fail the listing.
	_, _ = pipe.Exec(ctx)
	out := make([]NodeLock, 0, len(sorted))
	for i, n := range sorted {
		for _, cmd := range []redis.Cmder{qs[i].v, qs[i].pttl, qs[i].fence, qs[i].fencePTT} {
			if err := cmd.Err(); err != nil && !isReply(err) {
				return nil, err
			}
		}
		l := NodeLock{Name: n, Waiters: int(qs[i].waiters.Val())}
		fenceForeign := false
		switch f, err := qs[i].fence.Result(); {
		case err == redis.Nil:
		case err != nil:
			fenceForeign = true
		default:
			if l.Fence, err = strconv.ParseUint(f, 10, 64); err != nil {
				fenceForeign = true
			}
		}
		switch v, err := qs[i].v.Result(); {
		case err == redis.Nil:
			if fenceForeign {
				l.Foreign, l.PTTL = true, expiry(qs[i].fencePTT.Val())
			}
		case err != nil:
			l.Foreign, l.PTTL = true, expiry(qs[i].pttl.Val())
		default:
			if count, fence, owner, ok := ParseValue(v); ok {
				l.Owner, l.Count = owner, count
				l.Fence = max(l.Fence, fence)
				if d := qs[i].pttl.Val(); d > 0 {
					l.PTTL = d
				}
			} else {
				l.Foreign, l.PTTL = true, expiry(qs[i].pttl.Val())
			}
		}
		if l.Foreign {
			l.Count, l.Fence = 1, 0
		}
		out = append(out, l)
	}
	return out, nil
}

type nameKind struct {
	name string
	kind driver.Kind
}

// inspectKinds reads the read/write locks and semaphores in kinds, one
// script call each, in one pipeline.
func inspectKinds(ctx context.Context, c redis.UniversalClient, keyPrefix string, kinds map[nameKind]bool) ([]NodeLock, error) {
	if len(kinds) == 0 {
		return nil, nil
	}
	list := make([]nameKind, 0, len(kinds))
	for nk := range kinds {
		list = append(list, nk)
	}
	cmds := make([]*redis.Cmd, len(list))
	run := func() error {
		pipe := c.Pipeline()
		for i, nk := range list {
			kk := KindKeysFor(keyPrefix, nk.name, nk.kind)
			if nk.kind == driver.Permit {
				cmds[i] = inspectKindScript.EvalSha(ctx, pipe, []string{kk.Holders, kk.Values, kk.Fence}, "p")
			} else {
				cmds[i] = inspectKindScript.EvalSha(ctx, pipe, kk.rwKeys(), "rw")
			}
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	if err := run(); err != nil && isNoScript(err) {
		if err := inspectKindScript.Load(ctx, c).Err(); err != nil {
			return nil, err
		}
		_ = run()
	}
	out := make([]NodeLock, 0, len(list))
	for i, nk := range list {
		v, err := cmds[i].Slice()
		if err != nil {
			return nil, err
		}
		if len(v) != 8 {
			return nil, fmt.Errorf("unexpected reply from inspect script: %v", v)
		}
		num := func(x any) int {
			n, _ := toInt(x)
			return int(n)
		}
		l := NodeLock{Name: nk.name, Kind: nk.kind, Waiters: num(v[5]), PTTL: time.Duration(num(v[4])) * time.Millisecond}
		if f, ok := v[6].(string); ok {
			l.Fence, _ = strconv.ParseUint(f, 10, 64)
		}
		if nk.kind == driver.Permit {
			l.Holders, l.Count, l.Permits = num(v[2]), num(v[3]), num(v[7])
		} else {
			l.Readers, l.Count = num(v[2]), num(v[3])
			if w, ok := v[0].(string); ok {
				if count, fence, owner, ok := ParseValue(w); ok {
					l.Owner, l.Count = owner, count
					l.Fence = max(l.Fence, fence)
					l.PTTL = max(l.PTTL, time.Duration(num(v[1]))*time.Millisecond)
				} else {
					l.Foreign = true
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// isReply reports whether err is the server's error reply to one command
// (such as WRONGTYPE) or redis.Nil, rather than a failed connection.
func isReply(err error) bool {
	var re redis.Error
	return err == redis.Nil || errors.As(err, &re)
}

// expiry maps a PTTL reply to NodeLock.PTTL of a foreign key: its time to
// live, or -1 when it has none.
func expiry(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return -1
}

// ParseValue reads a lock's value (see the scripts): its hold count, token
// and owner. ok is false for a value dlock did not write, by the same rule
// as the scripts: count and token are decimal digits, the expiry and delay
// fields digits or empty.
func ParseValue(v string) (count int, fence uint64, owner string, ok bool) {
	parts := strings.SplitN(v, "\n", 5)
	if len(parts) != 5 || !digits(parts[0], false) || !digits(parts[1], false) || !digits(parts[2], true) || !digits(parts[3], true) {
		return 0, 0, "", false
	}
	c, err1 := strconv.Atoi(parts[0])
	f, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return c, f, parts[4], true
}

func digits(s string, empty bool) bool {
	if s == "" {
		return empty
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
