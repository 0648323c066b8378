package testserver

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Cluster is an etcd cluster or a ZooKeeper ensemble: one Server per member,
// each with its own fault controls (kill, restart or pause one member). Its
// methods are safe for concurrent use.
type Cluster struct {
	// Members are the cluster's servers, in a fixed order; their indexes are
	// what Leader returns.
	Members []*Server

	kind     string // "etcd" or "zk"
	url      string // set for external clusters
	external bool
	tb       testing.TB
	leader   func(c *Cluster) (int, error)
	fresh    atomic.Bool // set while Restart(true) brings up a whole new cluster
}

// Endpoints returns the members' client addresses, "127.0.0.1:port".
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.Members))
	for i, m := range c.Members {
		out[i] = m.Addr()
	}
	return out
}

// URL returns "etcd://h1,h2,h3" or "zk://h1,h2,h3": the dlock URL for the
// cluster (for an external cluster, the URL from the environment when it
// already has that form).
func (c *Cluster) URL() string {
	if c.url != "" {
		return c.url
	}
	return c.kind + "://" + strings.Join(c.Endpoints(), ",")
}

// External reports whether the cluster was named by an environment variable.
func (c *Cluster) External() bool { return c.external }

// Leader returns the index in Members of the current leader, asking the
// members themselves (etcd: the maintenance status API; ZooKeeper: the srvr
// four-letter word). A standalone ZooKeeper server is its own leader. It
// returns an error when no reachable member names a leader.
func (c *Cluster) Leader() (int, error) { return c.leader(c) }

// Restart kills every member, then restarts them all at once (see
// Server.Restart) and waits until all answer. Use it rather than one Restart
// per member after the cluster has lost its quorum: a lone etcd member does not
// answer until a quorum is back. With wipe the cluster starts again empty.
func (c *Cluster) Restart(wipe bool) error {
	if c.external {
		if c.tb != nil {
			c.tb.Helper()
			c.tb.Skipf("testserver: Restart %s: the cluster is external (set by an environment variable)", c.kind)
		}
		return fmt.Errorf("Restart %s: %w", c.kind, ErrExternal)
	}
	errs := make([]error, len(c.Members))
	for i, m := range c.Members {
		errs[i] = m.Kill()
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if wipe {
		c.fresh.Store(true)
		defer c.fresh.Store(false)
	}
	var wg sync.WaitGroup
	for i, m := range c.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Restart(wipe)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Stop stops every member (see Server.Stop). It is idempotent.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Stop()
		}()
	}
	wg.Wait()
}

// startMembers launches every member concurrently (members of a new cluster
// wait for each other) and stops them all if one fails.
func startMembers(members []*Server) error {
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.launch()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range members {
			m.Stop()
		}
		return err
	}
	return nil
}

// clusterForTest is forTest for clusters.
func clusterForTest(t testing.TB, c *Cluster, err error) *Cluster {
	t.Helper()
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	c.tb = t
	for _, m := range c.Members {
		m.tb = t
	}
	t.Cleanup(c.Stop)
	return c
}

// externalCluster builds a Cluster from an environment variable holding
// "scheme://h1,h2" or "h1,h2" (an "http://" prefix per host is dropped).
func externalCluster(t testing.TB, kind, env string, members int, leader func(*Cluster) (int, error)) *Cluster {
	t.Helper()
	raw := strings.TrimSpace(env)
	rest := raw
	if i := strings.Index(rest, "://"); i >= 0 && !strings.HasPrefix(rest, "http") {
		rest = rest[i+3:]
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 && !strings.HasPrefix(rest, "http") {
		rest = rest[:i]
	}
	c := &Cluster{kind: kind, external: true, tb: t, leader: leader}
	for _, h := range strings.Split(rest, ",") {
		h = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(h), "http://"), "https://")
		h = strings.TrimSuffix(h, "/")
		if h == "" {
			continue
		}
		c.Members = append(c.Members, &Server{kind: kind, external: true, addr: h, url: kind + "://" + h, tb: t})
	}
	if len(c.Members) == 0 {
		t.Fatalf("testserver: the %s cluster URL in the environment names no hosts", kind)
	}
	if len(c.Members) < members {
		t.Skipf("testserver: the external %s cluster lists %d endpoints, the test needs %d members", kind, len(c.Members), members)
	}
	if strings.HasPrefix(raw, kind+"://") {
		c.url = raw
	}
	return c
}
