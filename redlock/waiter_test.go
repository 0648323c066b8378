package redlock

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// TestUndoKeepsWaiterQueued: a queued waiter's attempt that a node grants
// while the others refuse (held there) is undone, and the waiter stays
// queued on that node at its score: the grant took it out of the node's
// queue, and without it the node would order the waiters unlike the
// others (a newcomer could take it). It fails if undo does not requeue.
func TestUndoKeepsWaiterQueued(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	ctx := ctxT(t, 20*time.Second)
	d, err := openTest(ctx, redlockURL(srvs, testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const name = "undo-requeue"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	// A holder on nodes 1 and 2 only.
	for _, a := range admins[1:] {
		if r, err := redisscript.Acquire(ctx, a, k, "holder", 10*time.Second, 0); err != nil || !r.Granted {
			t.Fatalf("holder: %+v, %v", r, err)
		}
	}
	score := time.Now().UnixMilli()
	req := driver.AcquireRequest{Name: name, Owner: "waiter", TTL: 10 * time.Second}
	_, err = d.tryAcquire(ctx, req, score)
	var le *driver.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("tryAcquire = %v, want a LockedError", err)
	}
	q := k.Lock + ":q"
	for i, a := range admins {
		got, err := a.ZScore(ctx, q, "waiter").Result()
		if err != nil || int64(got) != score {
			t.Errorf("node %d: waiter's score %v, %v; want %d", i, got, err, score)
		}
	}
	if n, _ := admins[0].Exists(ctx, k.Lock).Result(); n != 0 {
		t.Errorf("node 0 still holds the undone grant")
	}
}
