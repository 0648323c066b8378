package zklock

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testwait"
)

// TestInspectLockDelay: a holder killed (no release) with a lock-delay
// leaves a lock that TryAcquire refuses until its guard goes; Inspect lists
// it as kept by LockDelayOwner (Count 0, ExpiresIn within the delay) for a
// mutex, a read/write lock's writer and a semaphore's permit (Inspect arms
// the guard, so the delay runs from the first look), and not at all once the
// guard has gone.
func TestInspectLockDelay(t *testing.T) {
	const ttl, delay = time.Second, 3 * time.Second
	for _, kind := range []driver.Kind{driver.Exclusive, driver.Write, driver.Permit} {
		t.Run(kind.String(), func(t *testing.T) {
			name := fmt.Sprintf("inspdelay/%v/%d", kind, time.Now().UnixNano())
			req := driver.AcquireRequest{Name: name, Owner: "victim", TTL: ttl, LockDelay: delay, Kind: kind}
			if kind == driver.Permit {
				req.Permits = 1
			}
			p, err := newProxy(shared.Endpoints()[0])
			if err != nil {
				t.Fatal(err)
			}
			victim := newTestDriver(t, []string{p.addr()}, nil)
			if _, err := victim.TryAcquire(queuetest.Ctx(t, 10*time.Second), req); err != nil {
				t.Fatal(err)
			}
			// Crash: the connection cut, no release; the server deletes
			// the holder's node when its session expires.
			p.close()

			d := newTestDriver(t, shared.Endpoints(), nil)
			find := func() (driver.LockInfo, bool) {
				infos, err := d.Inspect(queuetest.Ctx(t, 10*time.Second), name)
				if err != nil {
					t.Fatal(err)
				}
				for _, li := range infos {
					if li.Name == name && (li.Kind == kind || kind == driver.Exclusive && li.Kind == 0) {
						return li, true
					}
				}
				return driver.LockInfo{}, false
			}
			var li driver.LockInfo
			testwait.Until(t, 20*time.Second, "Inspect lists the lock as kept by its lock-delay", func() bool {
				var ok bool
				li, ok = find()
				return ok && li.Owner == LockDelayOwner
			})
			t.Logf("blocked: %+v", li)
			if li.Count != 0 || li.ExpiresIn <= 0 || li.ExpiresIn > delay {
				t.Errorf("kept by lock-delay: got Count %d ExpiresIn %v, want 0 and in (0, %v]", li.Count, li.ExpiresIn, delay)
			}
			other := req
			other.Owner = "next"
			if kind == driver.Write {
				other.Kind = driver.Read // a lost writer's guard keeps readers out too
			}
			if _, err := d.TryAcquire(queuetest.Ctx(t, 10*time.Second), other); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("TryAcquire while Inspect reports the lock-delay: got %v, want ErrLocked", err)
			}
			testwait.Until(t, 20*time.Second, "the guard goes and Inspect no longer lists the lock", func() bool {
				_, ok := find()
				return !ok
			})
			g, err := d.TryAcquire(queuetest.Ctx(t, 10*time.Second), other)
			if err != nil {
				t.Fatalf("TryAcquire once Inspect lists no lock: %v", err)
			}
			l := driver.Lease{Name: name, Owner: other.Owner, Token: g.Token, Handle: g.Handle, TTL: ttl, Kind: other.Kind, Permits: other.Permits}
			if _, err := d.Release(queuetest.Ctx(t, 10*time.Second), l); err != nil {
				t.Fatal(err)
			}
		})
	}
}
