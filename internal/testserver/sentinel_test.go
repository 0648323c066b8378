package testserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testserver"
)

// TestSentinelFailover starts a master, two replicas and three sentinels,
// kills the master and checks that Sentinel promotes a replica, that data written to the master (and acknowledged by a replica with
// WAIT) survives, and that the killed node rejoins as a replica.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := testserver.RedisSentinel(t, &testserver.SentinelOptions{Password: "pw"})
	t.Logf("sentinel set started in %v: %s", time.Since(start), s.URL())
	ctx := context.Background()
	m, err := s.Master()
	if err != nil {
		t.Fatal(err)
	}
	if m != 0 {
		t.Fatalf("master = node %d, want 0 at start", m)
	}
	for round := range 1 {
		c := s.Client(m)
		key := "k" + string(rune('0'+round))
		if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := c.Wait(ctx, 2, 5*time.Second).Result(); err != nil || n != 2 {
			t.Fatalf("WAIT 2 = %d, %v", n, err)
		}
		c.Close()
		t0 := time.Now()
		old, promoted, err := s.Failover(60 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: master node %d killed, node %d promoted and set steady in %v", round, old, promoted, time.Since(t0))
		if old != m || promoted == m {
			t.Fatalf("failover: old %d promoted %d, master was %d", old, promoted, m)
		}
		if now, err := s.Master(); err != nil || now != promoted {
			t.Fatalf("Master() = %d, %v after promotion of %d", now, err, promoted)
		}
		c = s.Client(promoted)
		if v, err := c.Get(ctx, key).Result(); err != nil || v != "v" {
			t.Fatalf("GET %s on the promoted node = %q, %v: an acknowledged write was lost", key, v, err)
		}
		c.Close()
		m = promoted
	}
}
