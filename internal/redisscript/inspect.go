package redisscript

import (
	"context"
	"sort"
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
// names start with namePrefix, sorted by name: every name with a lock hash
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
		h     *redis.SliceCmd
		pttl  *redis.DurationCmd
		fence *redis.StringCmd
	}
	qs := make([]q, len(sorted))
	pipe := c.Pipeline()
	for i, n := range sorted {
		k := KeysFor(keyPrefix, n)
		qs[i] = q{
			h:     pipe.HMGet(ctx, k.Lock, "owner", "count", "fence"),
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
		if v, err := qs[i].h.Result(); err == nil && len(v) == 3 {
			if owner, ok := v[0].(string); ok && owner != "" {
				l.Owner = owner
				if c, err := toInt(v[1]); err == nil {
					l.Count = int(c)
				}
				if f, err := toUint(v[2]); err == nil && f > l.Fence {
					l.Fence = f
				}
				if d := qs[i].pttl.Val(); d > 0 {
					l.PTTL = d
				}
			}
		}
		out = append(out, l)
	}
	return out, nil
}
