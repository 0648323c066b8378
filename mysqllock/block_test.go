package mysqllock

import (
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestGetLockWaitsInServer: in ModeGetLock a waiting Lock of a held mutex
// waits in the server (its session in GET_LOCK on the lock's name, state
// "User lock"), and the server grants the lock to the waiters in the order
// they came, each with a token above the one before. Before, a waiting
// Lock waited for the holder's wake-up signal and then tried again: no
// session waited on the lock itself.
func TestGetLockWaitsInServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d0, _ := benchDriver(t, ModeGetLock)
	name := randomName("block-fifo")
	// The sessions waiting in GET_LOCK on the lock's own name (not on its
	// wake-up signal).
	waiting := func() int {
		t.Helper()
		var n int
		err := d0.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' AND INFO LIKE ?",
			"%GET_LOCK(X'"+hex.EncodeToString([]byte(LockName(name)))+"'%").Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	clients := make([]*dlock.Client, 4)
	for i := range clients {
		_, clients[i] = benchDriver(t, ModeGetLock)
	}
	held, err := clients[0].NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		who   int
		token uint64
	}
	grants := make(chan grant, 3)
	errs := make(chan error, 3)
	for i := 1; i <= 3; i++ {
		go func() {
			l, err := clients[i].NewMutex(name, nil).Lock(ctx)
			if err != nil {
				errs <- err
				return
			}
			grants <- grant{i, l.Token()}
			errs <- l.Unlock(ctx)
		}()
		testwait.Until(t, 10*time.Second, fmt.Sprintf("waiter %d waiting in GET_LOCK", i), func() bool { return waiting() == i })
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := held.Token()
	for want := 1; want <= 3; want++ {
		g := <-grants
		if g.who != want || g.token <= last {
			t.Fatalf("grant %d went to waiter %d with token %d (previous token %d); want waiter %d, a larger token", want, g.who, g.token, last, want)
		}
		last = g.token
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := waiting(); n != 0 {
		t.Fatalf("%d sessions still wait in GET_LOCK", n)
	}
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
	var n int
	if err := d.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock' AND INFO LIKE ?",
		"%GET_LOCK(X'"+hex.EncodeToString([]byte(LockName(name)))+"'%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
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
