package zklock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestInspectLockDelay runs queuetest.InspectLockDelay: a holder whose
// connection is cut leaves, once its session expires, its lock-delay guard,
// which Inspect lists as kept by LockDelayOwner (Inspect arms the guard, so
// the delay runs from the first look and never exceeds it).
func TestInspectLockDelay(t *testing.T) {
	queuetest.InspectLockDelay(t, LockDelayOwner, 3*time.Second,
		func(t testing.TB) queuetest.InspectDriver { return newTestDriver(t, shared.Endpoints(), nil) },
		func(t *testing.T, req driver.AcquireRequest) {
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
		})
}
