package redlock

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisinfo"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

// TestFencedQuorumIsGrantingNodes: the quorum that must have a fencing
// counter ≥ the token before an acquire returns is made of nodes that
// granted that acquire. A node that refused it (another owner holds it
// there) does not count, even once its counter has the token: that owner
// was granted there before the write-back, with a smaller token, and may
// complete its own quorum on a node of ours whose counter is still behind,
// once we release it.
//
// On 3 nodes (quorum 2): node 0 is held by owner A with token 5; node 1's
// counter is 2, node 2's is 5. Owner B's acquire is refused on node 0 and
// granted on node 1 (token 3), then on node 2 (token 6), which is held
// back (CLIENT PAUSE WRITE) until node 1 has granted and node 0 has
// answered, so that the attempt has all three answers. Node 1 is then
// paused for a while: the token 6 is written back to nodes 0 and 1, node
// 0 answers first, and {0, 2} have a counter ≥ 6. The acquire must not
// return before node 1, which granted it, has the token: otherwise A,
// whose call to node 1 was slow, is granted there after B releases (token
// 4) and holds the lock on {0, 1} with token max(5, 4) = 5, after B's 6.
func TestFencedQuorumIsGrantingNodes(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 30*time.Second)
	// A node timeout well above the pauses below: every call answers.
	d, err := openTest(ctx, redlockURL(srvs, "node_timeout=5s"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const name, ttl = "fenced-quorum", 30 * time.Second
	k := redisscript.KeysFor(d.prefix, name)
	setCounter := func(i int, v uint64) {
		t.Helper()
		if err := admins[i].Set(ctx, k.Fence, strconv.FormatUint(v, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	setCounter(0, 4)
	if a, err := redisscript.Acquire(ctx, admins[0], k, "owner-A", ttl, 0); err != nil || !a.Granted || a.Fence != 5 {
		t.Fatalf("owner A on node 0: %+v, %v; want granted with token 5", a, err)
	}
	setCounter(1, 2)
	setCounter(2, 5)

	for _, a := range admins {
		t.Cleanup(func() { _ = a.Do(context.Background(), "client", "unpause").Err() })
	}
	calls0 := scriptCalls(ctx, t, admins[0])
	pauseWrites(ctx, t, admins[2], 20*time.Second) // until unpaused below
	type result struct {
		g   driver.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-B", TTL: ttl})
		done <- result{g, err}
	}()
	testwait.Until(t, 10*time.Second, "node 1 granted owner B and node 0 ran its acquire", func() bool {
		n, err := admins[1].Exists(ctx, k.Lock).Result()
		return err == nil && n == 1 && scriptCalls(ctx, t, admins[0]) > calls0
	})
	// Node 1's write-back waits out this pause (reads go on).
	pauseWrites(ctx, t, admins[1], time.Second)
	if err := admins[2].Do(ctx, "client", "unpause").Err(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("owner B's acquire did not return")
	}
	if r.err != nil {
		t.Fatalf("owner B's acquire: %v", r.err)
	}
	if r.g.Token != 6 {
		t.Fatalf("owner B granted token %d, want 6 (node 2's)", r.g.Token)
	}
	c1, err := admins[1].Get(ctx, k.Fence).Uint64()
	if err != nil {
		t.Fatal(err)
	}
	if c1 < r.g.Token {
		t.Fatalf("the acquire returned token %d while node 1, which granted it, had fencing counter %d: "+
			"the fenced quorum counted node 0, which refused it (owner A, token 5, can then be granted node 1 with token %d)",
			r.g.Token, c1, c1+1)
	}

	// The rest of the story: B releases, and A's slow call reaches node 1.
	if left, err := d.Release(ctx, driver.Lease{Name: name, Owner: "owner-B", Token: r.g.Token, TTL: ttl, Handle: r.g.Handle}); err != nil || left != 0 {
		t.Fatalf("release: %d, %v; want 0, nil", left, err)
	}
	a, err := redisscript.Acquire(ctx, admins[1], k, "owner-A", ttl, 0)
	if err != nil || !a.Granted {
		t.Fatalf("owner A on node 1 after B's release: %+v, %v; want granted", a, err)
	}
	if a.Fence <= r.g.Token {
		t.Fatalf("owner A granted node 1 with token %d after B's grant with token %d", a.Fence, r.g.Token)
	}
}

// pauseWrites pauses a's node's write commands, scripts included, for d
// (CLIENT PAUSE WRITE).
func pauseWrites(ctx context.Context, t *testing.T, a *redis.Client, d time.Duration) {
	t.Helper()
	if err := a.Do(ctx, "client", "pause", d.Milliseconds(), "write").Err(); err != nil {
		t.Fatal(err)
	}
}

// scriptCalls is how many EVAL and EVALSHA calls a's node has run.
func scriptCalls(ctx context.Context, t *testing.T, a *redis.Client) int {
	t.Helper()
	info, err := a.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stats := redisinfo.Commands(info)
	return int(stats["eval"].Calls + stats["evalsha"].Calls)
}
