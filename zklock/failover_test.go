package zklock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestLeaderKilledWhileHeld runs queuetest.LeaderKilledWhileHeld (the
// leader is killed while a lock is held and waited for) on a 3-node ZooKeeper ensemble.
func TestLeaderKilledWhileHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("3-node ensemble: skipped in -short mode")
	}
	c := testserver.ZooKeeper(t, 3)
	const session = 4 * time.Second
	connA, err := connect(c.Endpoints(), session)
	if err != nil {
		t.Fatal(err)
	}
	defer connA.Close()
	a := newTestDriver(t, c.Endpoints(), nil)
	b := newTestDriver(t, c.Endpoints(), nil)
	queuetest.LeaderKilledWhileHeld(t, queuetest.Failover{
		A: a, B: b, Cluster: c, TTL: session,
		Queue: func(name string) []string { return children(t, connA, a.parent(name)) },
	})
}
