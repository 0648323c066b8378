package redisscript

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
	// few seconds later).
	Waiters int
}

// Inspect lists the locks under keyPrefix on the server(s) behind c whose
// names start with namePrefix, sorted by name: every name with a lock key
// or a fencing counter (a free lock that was once taken has a counter).
func Inspect(ctx context.Context, c redis.UniversalClient, keyPrefix, namePrefix string) ([]NodeLock, error) {
	pattern := keyPrefix + "{*"
	var (
		mu    sync.Mutex
		names = map[string]bool{}
	)
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			name, _, ok := NameFromKey(keyPrefix, it.Val())
			if ok && strings.HasPrefix(name, namePrefix) {
				mu.Lock()
				names[name] = true
				mu.Unlock()
			}
		}
		return it.Err()
	}
	var err error
	switch cc := c.(type) {
	case *redis.ClusterClient:
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	case *redis.Ring:
		err = cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	default:
		err = scan(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
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
		k := KeysFor(keyPrefix, n)
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
