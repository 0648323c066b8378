package queuetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// InspectDriver is a queue-based driver that lists its locks.
type InspectDriver interface {
	Driver
	driver.Inspector
}

// InspectLockDelay: a holder killed (no release) with a lock-delay leaves a
// lock that TryAcquire refuses until its guard goes; Inspect lists it as
// kept by lockDelayOwner (Count 0, ExpiresIn in (0, maxExpiresIn]) for a
// mutex, a read/write lock's writer and a semaphore's permit, and not at all
// once the guard has gone. crash takes req with a driver of its own and ends
// that driver as a crash would (nothing released); newDriver makes the
// driver that looks.
func InspectLockDelay(t *testing.T, lockDelayOwner string, maxExpiresIn time.Duration, newDriver func(t testing.TB) InspectDriver, crash func(t *testing.T, req driver.AcquireRequest)) {
	const ttl, delay = time.Second, 3 * time.Second
	for _, kind := range []driver.Kind{driver.Exclusive, driver.Write, driver.Permit} {
		t.Run(kind.String(), func(t *testing.T) {
			name := fmt.Sprintf("inspdelay/%v/%d", kind, time.Now().UnixNano())
			req := driver.AcquireRequest{Name: name, Owner: "victim", TTL: ttl, LockDelay: delay, Kind: kind}
			if kind == driver.Permit {
				req.Permits = 1
			}
			crash(t, req)

			d := newDriver(t)
			find := func() (driver.LockInfo, bool) {
				infos, err := d.Inspect(Ctx(t, 10*time.Second), name)
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
				return ok && li.Owner == lockDelayOwner
			})
			t.Logf("blocked: %+v", li)
			if li.Count != 0 || li.ExpiresIn <= 0 || li.ExpiresIn > maxExpiresIn {
				t.Errorf("kept by lock-delay: got Count %d ExpiresIn %v, want 0 and in (0, %v]", li.Count, li.ExpiresIn, maxExpiresIn)
			}
			other := req
			other.Owner = "next"
			if kind == driver.Write {
				other.Kind = driver.Read // a lost writer's guard keeps readers out too
			}
			if _, err := d.TryAcquire(Ctx(t, 10*time.Second), other); !errors.Is(err, driver.ErrLocked) {
				t.Fatalf("TryAcquire while Inspect reports the lock-delay: got %v, want ErrLocked", err)
			}
			testwait.Until(t, 20*time.Second, "the guard goes and Inspect no longer lists the lock", func() bool {
				_, ok := find()
				return !ok
			})
			g, err := d.TryAcquire(Ctx(t, 10*time.Second), other)
			if err != nil {
				t.Fatalf("TryAcquire once Inspect lists no lock: %v", err)
			}
			l := driver.Lease{Name: name, Owner: other.Owner, Token: g.Token, Handle: g.Handle, TTL: ttl, Kind: other.Kind, Permits: other.Permits}
			if _, err := d.Release(Ctx(t, 10*time.Second), l); err != nil {
				t.Fatal(err)
			}
		})
	}
}
