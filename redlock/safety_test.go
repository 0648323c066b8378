package redlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/redisscript/redistest"
	"github.com/dlock/dlock/internal/testserver"
)

func safetyEnv(t *testing.T) ([]*testserver.Server, []*redis.Client, redistest.NewDriver) {
	srvs := testserver.RedisN(t, 3, nil)
	var admins []*redis.Client
	for _, s := range srvs {
		opt, err := redis.ParseURL(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		a := redis.NewClient(opt)
		t.Cleanup(func() { _ = a.Close() })
		admins = append(admins, a)
	}
	return srvs, admins, func(ctx context.Context) (driver.Driver, error) {
		return openTest(ctx, redlockURL(srvs, testNodeTimeout))
	}
}

// TestForeignKeys: keys dlock did not write at a name's keys, on every
// node, are locks held by an unknown owner (audit finding 7).
func TestForeignKeys(t *testing.T) {
	_, admins, open := safetyEnv(t)
	redistest.ForeignKeys(t, admins, open)
}

// TestCloseRacingLock: Close leaves no lock behind on any node, in-flight
// grants included (audit finding 5).
func TestCloseRacingLock(t *testing.T) {
	_, admins, open := safetyEnv(t)
	redistest.CloseRacingLock(t, admins, open)
}

// TestUnlockRightAfterLock: an acquire returns once a quorum granted, while
// the last node may still be working on it; an Unlock right away must not
// overtake that node's acquire, or the node keeps the lock until its TTL.
// Many lock-unlock pairs run at once on distinct names (30s TTL), then
// every node must be free of them.
func TestUnlockRightAfterLock(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	c := newClient(t, srvs, 30*time.Second)
	ctx := ctxT(t, 30*time.Second)
	const rounds, locks = 4, 48
	for r := range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, locks)
		for i := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := c.NewMutex(fmt.Sprintf("straggler-%d-%d", r, i), nil).TryLock(ctx)
				if err == nil {
					err = l.Unlock(ctx)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Second)
		for i, a := range admins {
			for j := range locks {
				k := redisscript.KeysFor(DefaultKeyPrefix, fmt.Sprintf("straggler-%d-%d", r, j))
				for {
					n, err := a.Exists(ctx, k.Lock).Result()
					if err != nil {
						t.Fatal(err)
					}
					if n == 0 {
						break
					}
					if time.Now().After(deadline) {
						pttl, _ := a.PTTL(ctx, k.Lock).Result()
						t.Fatalf("round %d: node %d still has %s (PTTL %v) after its Unlock returned", r, i, k.Lock, pttl)
					}
					time.Sleep(10 * time.Millisecond) // polling for the key to go, with a deadline
				}
			}
		}
	}
}

// TestForeignKeyOnSomeNodes: a foreign key on one node of three is one
// refusal (the lock is granted on the other two and the key is left as it
// was); on two nodes it holds the lock: ErrLocked with an unknown retry
// time, never an error, and Inspect shows the name held by "?".
func TestForeignKeyOnSomeNodes(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	c := newClient(t, srvs, 5*time.Second)
	ctx := ctxT(t, 20*time.Second)
	const name = "foreign-some"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	if err := admins[2].HSet(ctx, k.Lock, "other", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admins[1].Set(ctx, k.Fence, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Node 0 is free, node 1 has a foreign fence key, node 2 a foreign
	// lock key: only one node can grant.
	if l, err := c.NewMutex(name, nil).TryLock(ctx); err == nil {
		t.Fatalf("granted (token %d) with foreign keys on 2 of 3 nodes", l.Token())
	} else if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock with foreign keys on 2 of 3 nodes: %v; want ErrLocked", err)
	}
	infos, err := c.Inspect(ctx, name)
	if err != nil || len(infos) != 1 || infos[0].Owner != "?" || infos[0].Token != 0 || infos[0].ExpiresIn >= 0 {
		t.Fatalf("Inspect with foreign keys on 2 of 3 nodes: %+v, %v; want held by \"?\", token 0, no expiry", infos, err)
	}
	if err := admins[1].Del(ctx, k.Fence).Err(); err != nil {
		t.Fatal(err)
	}
	l, err := c.NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with a foreign key on 1 of 3 nodes: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := admins[2].HGetAll(ctx, k.Lock).Result(); err != nil || len(v) != 1 || v["other"] != "1" {
		t.Fatalf("foreign hash on node 2 is %v, %v; want it untouched", v, err)
	}
}

// TestLateUnlockAfterMajorityExpiry: a lease that expired on a majority of
// nodes (here: its keys deleted there, as a forward clock step on those nodes
// would expire them) may have passed to another owner, so its Unlock must
// report ErrNotHeld even though one node still held it — found by the
// checker as a late-unlock under clock-jump.
func TestLateUnlockAfterMajorityExpiry(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	c := newClient(t, srvs, 5*time.Second)
	ctx := ctxT(t, 20*time.Second)
	const name = "late-unlock"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	l, err := c.NewMutex(name, &dlock.MutexOptions{TTL: 30 * time.Second}).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range admins[:2] {
		if err := a.Del(ctx, k.Lock).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of a lease gone from 2 of 3 nodes = %v, want ErrNotHeld", err)
	}
	if n, err := admins[2].Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		t.Fatalf("node 2 still has the lock key (%d, %v): the leftover hold must still be released", n, err)
	}
}
