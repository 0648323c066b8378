package etcdlock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestInspectLockDelay runs queuetest.InspectLockDelay: a holder whose
// keepalives stop and whose client closes leaves its lock-delay guard, which
// Inspect lists as kept by LockDelayOwner until the guard's lease ends (its
// TTL may exceed the delay by up to 2 s: etcd counts whole seconds).
func TestInspectLockDelay(t *testing.T) {
	queuetest.InspectLockDelay(t, LockDelayOwner, 5*time.Second,
		func(t testing.TB) queuetest.InspectDriver {
			return newTestDriver(t, newClient(t, shared.Endpoints()), nil)
		},
		func(t *testing.T, req driver.AcquireRequest) {
			victim := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
			if _, err := victim.TryAcquire(queuetest.Ctx(t, 10*time.Second), req); err != nil {
				t.Fatal(err)
			}
			// Crash: no keepalives, no release, the lease left to expire.
			victim.stop()
			if err := victim.cli.Close(); err != nil {
				t.Fatal(err)
			}
		})
}
