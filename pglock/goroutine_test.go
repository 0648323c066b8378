package pglock

import (
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestSessionLockStartsNoGoroutine: an uncontended Lock+Unlock through a
// Client in a session mode starts no goroutine. Each hold used to get a
// loss signal of its own, and the Client started a goroutine to watch every
// grant (and woke the previous one to stop it); the holds made one after
// another on a pooled connection now share that connection's signal, whose
// watcher the Client keeps idle for the next grant.
func TestSessionLockStartsNoGoroutine(t *testing.T) {
	for _, mode := range []Mode{ModeAdvisory, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			_, c := benchDriver(t, mode)
			sqltest.NoGoroutinePerLock(t, c.NewMutex(randomName("nogoroutine"), nil))
		})
	}
}

// TestSessionLossAfterSharedSignal: see sqltest.SharedLossSignal.
func TestSessionLossAfterSharedSignal(t *testing.T) {
	h := newTestHarness(t, ModeAdvisory)
	sqltest.SharedLossSignal(t, h.driver(t), h.Drop)
}
