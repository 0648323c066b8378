package redisscript

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeLock is one lock as one server sees it.
type NodeLock struct {
	Name  string
	Owner string // empty when free
	Count int
	Fence uint64 // the highest token this server knows for the name
	// PTTL is the time until the key expires by itself: the lease plus any
	// lock-delay. Zero when free.
	PTTL time.Duration
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
		v     *redis.StringCmd
		pttl  *redis.DurationCmd
		fence *redis.StringCmd
	}
	qs := make([]q, len(sorted))
	pipe := c.Pipeline()
	for i, n := range sorted {
		k := KeysFor(keyPrefix, n)
		qs[i] = q{
			v:     pipe.Get(ctx, k.Lock),
			pttl:  pipe.PTTL(ctx, k.Lock),
			fence: pipe.Get(ctx, k.Fence),
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, err
	}
	out := make([]NodeLock, 0, len(sorted))
	for i, n := range sorted {
		l := NodeLock{Name: n}
		if f, err := qs[i].fence.Uint64(); err == nil {
			l.Fence = f
		}
		if v, err := qs[i].v.Result(); err == nil {
			if count, fence, owner, ok := ParseValue(v); ok {
				l.Owner, l.Count = owner, count
				l.Fence = max(l.Fence, fence)
				if d := qs[i].pttl.Val(); d > 0 {
					l.PTTL = d
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// ParseValue reads a lock's value (see the scripts): its hold count, token
// and owner.
func ParseValue(v string) (count int, fence uint64, owner string, ok bool) {
	parts := strings.SplitN(v, "\n", 5)
	if len(parts) != 5 {
		return 0, 0, "", false
	}
	c, err1 := strconv.Atoi(parts[0])
	f, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return c, f, parts[4], true
}
