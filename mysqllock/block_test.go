package mysqllock

import (
	"context"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestWaitsInServer: in ModeGetLock a waiting Lock of a held mutex waits in
// the server (its session in GET_LOCK on the lock's name, state "User
// lock"); in ModeRowLock, with a TTL of 3s or more (these clients' is
// 30s), in its locking read of the name's row, without NOWAIT. The server
// grants the lock to the waiters in the order they came, each with a token
// above the one before. Before, a waiting Lock waited for the holder's
// wake-up signal and then tried again: no session waited on the lock
// itself. Beside its own holder: a waiting Lock on the driver that holds
// the mutex (for another owner) waits in the server too, in its place
// among the waiters of other drivers; before, it was kept out of the
// server's queue while its driver held the name (see pglock's
// TestWaitsInServerBesideOwnHolder).
func TestWaitsInServer(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		d0, c0 := benchDriver(t, mode)
		waiting := func(name string) func() int {
			if mode == ModeRowLock {
				return func() int { return rowWaiters(t, d0, name) }
			}
			return func() int { return waitingOn(t, d0, name) }
		}
		t.Run(string(mode), func(t *testing.T) {
			name := randomName("block-fifo-" + string(mode))
			clients := []*dlock.Client{c0}
			for range 3 {
				_, c := benchDriver(t, mode)
				clients = append(clients, c)
			}
			sqltest.ServerQueueOrder(t, clients, name, waiting(name))
		})
		t.Run(string(mode)+"/beside-own-holder", func(t *testing.T) {
			name := randomName("block-beside-" + string(mode))
			_, c1 := benchDriver(t, mode)
			sqltest.ServerQueueOrder(t, []*dlock.Client{c0, c0, c1, c0}, name, waiting(name))
		})
	}
}

// rowWaiters counts the sessions whose locking read of name's row waits
// (the waiting form, without NOWAIT).
func rowWaiters(t *testing.T, d *Driver, name string) int {
	t.Helper()
	var n int
	err := d.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND INFO LIKE ?",
		"%name = "+hexLit(name)+" FOR UPDATE").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRowLockWaitTTL: a TTL under 3s (a third under a second, which
// innodb_lock_wait_timeout cannot count) keeps a rowlock waiter out of the
// server's queue; it waits by its signal as before.
func TestRowLockWaitTTL(t *testing.T) {
	d, _ := benchDriver(t, ModeRowLock)
	name := randomName("block-row-ttl")
	if d.Queues(driver.AcquireRequest{Name: name, Owner: "o", TTL: 2 * time.Second}) {
		t.Error("Queues = true for a 2s TTL")
	}
	if !d.Queues(driver.AcquireRequest{Name: name, Owner: "o", TTL: 3 * time.Second}) {
		t.Error("Queues = false for a 3s TTL")
	}
	if _, err := d.Acquire(context.Background(), driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Second}); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("Acquire with a 1s TTL: %v, want ErrUnsupported", err)
	}
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

// TestCancelAsWaitEnds: waits whose context ends about when their turn
// does (getlock: 300, turns of 2ms), and waits cancelled early in a long
// turn (30, turns of 1s): each ends with the context's error and no data
// race (under -race), and no session is left waiting in the server
// (getlock: in GET_LOCK; rowlock: in its locking read of the row), the
// lock free at once after its holder's release. A cancelled wait is ended
// by KILL QUERY; go-sql-driver's own reaction, closing the connection, left
// the sessions of the long turns waiting in the lock's queue.
func TestCancelAsWaitEnds(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			_, c := benchDriver(t, mode)
			d, _ := benchDriver(t, mode)
			name := randomName("block-cancel-" + string(mode))
			held, err := c.NewMutex(name, nil).TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			wait := func(ttl, within time.Duration) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), within)
				defer cancel()
				_, err := d.Acquire(ctx, driver.AcquireRequest{Name: name, Owner: "w", TTL: ttl})
				if err == nil {
					t.Fatal("a waiter was granted a held lock")
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("a cancelled wait: %v, want the context's deadline", err)
				}
			}
			if mode == ModeGetLock {
				for i := range 300 {
					wait(6*time.Millisecond, time.Duration(500+i*7%1500)*time.Microsecond)
				}
			}
			for i := range 30 {
				wait(3*time.Second, time.Duration(1+i%20)*time.Millisecond)
			}
			waiting := waitingOn(t, d, name)
			if mode == ModeRowLock {
				waiting = rowWaiters(t, d, name)
			}
			if waiting != 0 {
				t.Fatalf("%d sessions of cancelled waits still wait in the server", waiting)
			}
			if err := held.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			l, err := c.NewMutex(name, nil).TryLock(context.Background())
			if err != nil {
				t.Fatalf("TryLock after cancelled waits and the holder's release: %v", err)
			}
			_ = l.Unlock(context.Background())
		})
	}
}
