package etcdlock

import (
	"testing"
	"time"

	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
)

// TestLeaderKilledWhileHeld runs queuetest.LeaderKilledWhileHeld (the
// leader is killed while a lock is held and waited for) on a 3-member etcd cluster.
func TestLeaderKilledWhileHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster: skipped in -short mode")
	}
	c := testserver.Etcd(t, 3)
	// The lease must outlast an election (1s election timeout), as in any
	// deployment: a lease shorter than the time to elect a leader is lost
	// (cleanly: Done closes) whenever the leader dies.
	const ttl = 5 * time.Second
	a := newTestDriver(t, newClient(t, c.Endpoints()), nil)
	b := newTestDriver(t, newClient(t, c.Endpoints()), nil)
	queuetest.LeaderKilledWhileHeld(t, queuetest.Failover{
		A: a, B: b, Cluster: c, TTL: ttl,
		Queue: func(name string) []string { return keys(t, a.cli, a.queuePrefix(name)) },
	})
}
