package mysqllock

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestGetLockWaitsInServer: in ModeGetLock a waiting Lock of a held mutex
// waits in the server (its session in GET_LOCK on the lock's name, state
// "User lock"), and the server grants the lock to the waiters in the order
// they came, each with a token above the one before. Before, a waiting
// Lock waited for the holder's wake-up signal and then tried again: no
// session waited on the lock itself.
func TestGetLockWaitsInServer(t *testing.T) {
	d0, _ := benchDriver(t, ModeGetLock)
	name := randomName("block-fifo")
	clients := make([]*dlock.Client, 4)
	for i := range clients {
		_, clients[i] = benchDriver(t, ModeGetLock)
	}
	sqltest.ServerQueueOrder(t, clients, name, func() int { return waitingOn(t, d0, name) })
}

// TestGetLockWaitsInServerBesideOwnHolder: a waiting Lock on the driver
// that holds the mutex (for another owner) waits in GET_LOCK too, in its
// place among the waiters of other drivers. Before, it was kept out of the
// server's queue while its driver held the name (see pglock's
// TestWaitsInServerBesideOwnHolder).
func TestGetLockWaitsInServerBesideOwnHolder(t *testing.T) {
	d0, c0 := benchDriver(t, ModeGetLock)
	_, c1 := benchDriver(t, ModeGetLock)
	name := randomName("block-beside")
	sqltest.ServerQueueOrder(t, []*dlock.Client{c0, c0, c1, c0}, name, func() int { return waitingOn(t, d0, name) })
}

// waitingOn counts the sessions waiting in GET_LOCK on name's lock (not on
// its wake-up signal).
func waitingOn(t *testing.T, d *Driver, name string) int {
	t.Helper()
	var n int
	err := d.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' AND INFO LIKE ?",
		"%GET_LOCK(X'"+hex.EncodeToString([]byte(LockName(name)))+"'%").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGetLockCancelAsWaitEnds: waits whose context ends about when their
// turn does (300, turns of 2ms), and waits cancelled early in a long turn
// (20, turns of 1s): each ends with an error and no data race (under
// -race), and no session is left waiting in GET_LOCK, the lock free at
// once after its holder's release. A cancelled wait is ended by KILL
// QUERY; go-sql-driver's own reaction, closing the connection, left the
// sessions of the long turns waiting in the lock's queue.
func TestGetLockCancelAsWaitEnds(t *testing.T) {
	_, c := benchDriver(t, ModeGetLock)
	d, _ := benchDriver(t, ModeGetLock)
	name := randomName("block-cancel")
	held, err := c.NewMutex(name, nil).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wait := func(ttl, within time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		if _, err := d.Acquire(ctx, driver.AcquireRequest{Name: name, Owner: "w", TTL: ttl}); err == nil {
			t.Fatal("a waiter was granted a held lock")
		}
	}
	for i := range 300 {
		wait(6*time.Millisecond, time.Duration(500+i*7%1500)*time.Microsecond)
	}
	for range 20 {
		wait(3*time.Second, 20*time.Millisecond)
	}
	if n := waitingOn(t, d, name); n != 0 {
		t.Fatalf("%d sessions of cancelled waits still wait in GET_LOCK", n)
	}
	if err := held.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := c.NewMutex(name, nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock after cancelled waits and the holder's release: %v", err)
	}
	_ = l.Unlock(context.Background())
}
