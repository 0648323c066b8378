package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

// QueueOrder checks that waiters in different processes (drivers) are
// granted in the order they asked, and that the holder asking again right
// after its Unlock goes behind them. admins are the nodes' admin clients
// (one for redislock); every node must have queued the waiters.
func QueueOrder(t *testing.T, admins []*redis.Client, open NewDriver) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name = "queued"
	k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
	var cs []*dlock.Client
	for range 3 {
		d, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	type result struct {
		who int
		l   *dlock.Lease
		err error
	}
	lock := func(i int) <-chan result {
		ch := make(chan result, 1)
		go func() {
			l, err := cs[i].NewMutex(name, nil).Lock(ctx)
			ch <- result{i, l, err}
		}()
		return ch
	}
	queued := func(n int64) {
		t.Helper()
		testwait.Until(t, 10*time.Second, "the waiters to be queued on every node", func() bool {
			for _, a := range admins {
				if got, err := a.ZCard(ctx, k.Queue).Result(); err != nil || got != n {
					return false
				}
			}
			return true
		})
	}
	holder, err := cs[0].NewMutex(name, nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := lock(1)
	queued(1)
	second := lock(2)
	queued(2)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	again := lock(0)
	var order []int
	for len(order) < 3 {
		var r result
		select {
		case r = <-first:
		case r = <-second:
		case r = <-again:
		case <-ctx.Done():
			t.Fatalf("granted so far: %v; the rest never were", order)
		}
		if r.err != nil {
			t.Fatalf("client %d: %v", r.who, r.err)
		}
		order = append(order, r.who)
		if err := r.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if order[0] != 1 || order[1] != 2 || order[2] != 0 {
		t.Fatalf("grant order %v, want [1 2 0] (queue order, the releaser last)", order)
	}
}
