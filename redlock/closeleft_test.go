package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

// dropReleases makes a client lose the releases of one lock: while armed,
// a release script call on lock (its first key) is never sent and fails
// at its context's deadline, as a release does that a loaded machine
// delays past the node timeout. Every other command goes through.
type dropReleases struct {
	lock    string
	armed   *atomic.Bool
	dropped *atomic.Int32
}

func (h dropReleases) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h dropReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && h.isRelease(cmd.Args()) {
			h.dropped.Add(1)
			<-ctx.Done() // the node timeout: the driver gives up on it
			cmd.SetErr(ctx.Err())
			return ctx.Err()
		}
		return next(ctx, cmd)
	}
}

func (h dropReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isRelease tells a release script call on h.lock: EVAL(SHA) script
// numkeys keys... owner token channel (three arguments; the acquire
// scripts have more).
func (h dropReleases) isRelease(args []any) bool {
	if len(args) < 4 {
		return false
	}
	name, _ := args[0].(string)
	if name != "evalsha" && name != "eval" {
		return false
	}
	var nkeys int
	switch n := args[2].(type) {
	case int:
		nkeys = n
	case int64:
		nkeys = int(n)
	case string:
		_, _ = fmt.Sscan(n, &nkeys)
	}
	return nkeys >= 1 && len(args) == 3+nkeys+3 && args[3] == h.lock
}

// dropEnv is a driver over srvs whose node 0 loses the releases of name
// while armed, and the admin clients of the nodes.
func dropEnv(t *testing.T, name string) (*Driver, []*redis.Client, *atomic.Bool, *atomic.Int32) {
	t.Helper()
	srvs, admins, _ := safetyEnv(t)
	var armed atomic.Bool
	var dropped atomic.Int32
	var clients []redis.UniversalClient
	for i, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		if i == 0 {
			c.AddHook(dropReleases{lock: redisscript.KeysFor(DefaultKeyPrefix, name).Lock, armed: &armed, dropped: &dropped})
		}
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	d, err := New(clients, &Options{NodeTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d, admins, &armed, &dropped
}

// checkFreedByClose closes d and fails t unless node 0 is free of k's lock.
func checkFreedByClose(t *testing.T, ctx context.Context, d *Driver, admin *redis.Client, k redisscript.Keys) {
	t.Helper()
	if n, err := admin.Exists(ctx, k.Lock).Result(); err != nil || n != 1 {
		t.Fatalf("before Close, node 0 has %s: %d, %v; want the grant whose release was lost", k.Lock, n, err)
	}
	_ = d.Close()
	if n, err := admin.Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		pttl, _ := admin.PTTL(ctx, k.Lock).Result()
		t.Fatalf("node 0 still has %s (PTTL %v) after Close: a release lost to the node timeout left it behind", k.Lock, pttl)
	}
}

// TestCloseReleasesLostUndo: an acquire refused by a quorum undoes its
// grant on node 0; when that release is lost to the node timeout (as a
// Lock racing Close under load, TestCloseRacingLock, saw it), the grant
// is booked, and Close releases it. Before, nothing knew of it, and the
// lock stayed on node 0 for its whole TTL after Close.
func TestCloseReleasesLostUndo(t *testing.T) {
	const name = "lost-undo"
	d, admins, armed, dropped := dropEnv(t, name)
	ctx := ctxT(t, 20*time.Second)
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	// Nodes 1 and 2 are held by an unknown owner: they refuse, node 0
	// grants, and the attempt undoes node 0's grant.
	for _, a := range admins[1:] {
		if err := a.Set(ctx, k.Lock, "foreign", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	armed.Store(true)
	_, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: 30 * time.Second})
	armed.Store(false)
	if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryAcquire refused by 2 of 3 nodes: %v; want ErrLocked", err)
	}
	if dropped.Load() == 0 {
		t.Fatal("no release of node 0's grant was dropped")
	}
	checkFreedByClose(t, ctx, d, admins[0], k)
}

// TestCloseReleasesLostRelease: a Release that nodes 1 and 2 answer but
// node 0 does not (lost to the node timeout) succeeds, and the grant stays
// booked, so that Close releases it on node 0. Before, the book dropped
// it, and the lock stayed on node 0 for its whole TTL after Close.
func TestCloseReleasesLostRelease(t *testing.T) {
	const name = "lost-release"
	d, admins, armed, dropped := dropEnv(t, name)
	ctx := ctxT(t, 20*time.Second)
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	req := driver.AcquireRequest{Name: name, Owner: "o", TTL: 30 * time.Second}
	g, err := d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// Every node has answered the acquire: Release goes to all at once.
	lease := driver.Lease{Name: name, Owner: req.Owner, TTL: req.TTL, Token: g.Token, Handle: g.Handle}
	if h, _ := g.Handle.(*handle); h != nil {
		testwait.Until(t, 10*time.Second, "every node answered the acquire", func() bool { return h.settled.Load() == nil })
	}
	armed.Store(true)
	_, err = d.Release(ctx, lease)
	armed.Store(false)
	if err != nil {
		t.Fatalf("Release answered by 2 of 3 nodes: %v", err)
	}
	if dropped.Load() == 0 {
		t.Fatal("no release on node 0 was dropped")
	}
	checkFreedByClose(t, ctx, d, admins[0], k)
}
