package redlock

import (
	"context"
	"testing"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript/redistest"
)

// TestQueueOrder: waiters in different processes are granted in the order
// they asked, on all three nodes alike, and the holder asking again right
// after its Unlock goes behind them.
func TestQueueOrder(t *testing.T) {
	srvs, admins, _ := safetyEnv(t)
	raw := redlockURL(srvs, "")
	redistest.QueueOrder(t, admins, func(ctx context.Context) (driver.Driver, error) { return openTest(ctx, raw) })
}
