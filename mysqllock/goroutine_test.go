package mysqllock

import (
	"context"
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestSessionLockStartsNoGoroutine: an uncontended Lock+Unlock through a
// Client in a session mode starts no goroutine: the holds made one after
// another on a pooled connection share its loss signal (see pinned.Loss),
// whose watcher the Client keeps idle for the next grant, where a signal
// per hold made the Client start a goroutine to watch each; and
// ModeRowLock's two queries per Lock go to the driver connection directly
// (queryRow), where database/sql's QueryRowContext started a goroutine for
// each (Rows.awaitDone).
func TestSessionLockStartsNoGoroutine(t *testing.T) {
	for _, mode := range []Mode{ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			_, c := benchDriver(t, mode)
			sqltest.NoGoroutinePerLock(t, c.NewMutex(randomName("nogoroutine"), nil))
		})
	}
}

// TestSessionLossAfterSharedSignal: see sqltest.SharedLossSignal.
func TestSessionLossAfterSharedSignal(t *testing.T) {
	ctx := context.Background()
	h := newTestHarness(t, ModeGetLock)
	d, err := h.NewDriver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	sqltest.SharedLossSignal(t, d, h.Drop)
}
