package check

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/dlock/dlock/internal/testserver"
)

// sentinelMode is the replication mode of a redis-sentinel URL: "wait" when
// it asks for min_replicas ≥ 1, else "async".
func sentinelMode(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "async"
	}
	if n, err := strconv.Atoi(u.Query().Get("min_replicas")); err == nil && n > 0 {
		return "wait"
	}
	return "async"
}

// sentinelApplies refuses the faults a redis-sentinel run cannot take: its
// workers reach the master at the address Sentinel names, so no proxy can
// stand in front of it (partition, latency), and the server faults written
// for one server or a consensus cluster would hit an arbitrary node.
func sentinelApplies(kind, fault string) error {
	if kind != "redis-sentinel" {
		return nil
	}
	switch fault {
	case FaultNone, FaultPauseHolder, FaultKillHolder, FaultFailoverMaster:
		return nil
	}
	return fmt.Errorf("fault %s does not apply to redis-sentinel: it takes pause-holder, kill-holder and failover-master", fault)
}

// startSentinel starts a master, two replicas and three sentinels. In mode
// wait the workers' URL asks for min_replicas=1 with a replica_timeout of
// TTL/4, so that a stalled WAIT leaves a lease time to be renewed later.
func (s *Servers) startSentinel(ttl time.Duration) error {
	set, err := testserver.StartRedisSentinel(nil)
	if err != nil {
		return err
	}
	s.sentinel = set
	s.members = set.Nodes
	s.url = set.URL()
	if s.mode == "wait" {
		s.url += "&min_replicas=1&replica_timeout=" + max(ttl/4, time.Millisecond).String()
	}
	return nil
}

// failoverMaster is FaultFailoverMaster: it stalls the master's replicas
// (testserver.SentinelSet.StallReplicas), leaves the workers TTL/3 to be
// granted locks that reach no replica, kills the master, continues the
// replicas, waits for Sentinel to promote one, and brings the old master
// back as a replica. The fault ends once the set is steady again; then it
// waits (at most 2×TTL + 2s) until the workers have been granted locks by
// the new master, so that a run that ends next still sees what the failover
// did to the fencing counters.
func (r *runner) failoverMaster(ctx context.Context) {
	set := r.servers.sentinel
	if set == nil {
		return
	}
	m, err := set.Master()
	if err != nil {
		r.mark(KindFaultStart, FaultFailoverMaster, "master", "")
		r.mark(KindFaultEnd, FaultFailoverMaster, "master", err.Error())
		return
	}
	target := fmt.Sprintf("master (server %d)", m)
	r.mark(KindFaultStart, FaultFailoverMaster, target, "")
	ferr := func() error {
		resume, err := set.StallReplicas(m)
		if err != nil {
			return err
		}
		pause(context.Background(), r.cfg.TTL/3) // the fault itself: grants that reach no replica
		err = set.Nodes[m].Kill()
		resume()
		if err != nil {
			return err
		}
		promoted, err := set.AwaitPromotion(m, 60*time.Second)
		if err != nil {
			return err
		}
		if err := set.Rejoin(m, promoted); err != nil {
			return err
		}
		return set.Settle(60 * time.Second)
	}()
	r.mark(KindFaultEnd, FaultFailoverMaster, target, errText(ferr))
	r.mu.Lock()
	before := r.grants
	r.mu.Unlock()
	deadline := time.Now().Add(2*r.cfg.TTL + 2*time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		n := r.grants
		r.mu.Unlock()
		if n >= before+r.cfg.Workers {
			return
		}
		pause(context.Background(), 20*time.Millisecond) // polling the grant count, bounded by deadline
	}
}
