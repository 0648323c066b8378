package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/locktest"
)

// startCluster starts a three-master Redis Cluster on loopback ports (a
// small private starter: internal/testserver has no cluster mode) and
// returns the node addresses. It skips the test when redis-server or
// redis-cli is missing.
func startCluster(t testing.TB) []string {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not installed")
	}
	var addrs []string
	for i := 0; i < 3; i++ {
		port := clusterPort(t)
		dir := t.TempDir()
		cmd := exec.Command(server, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
			"--dir", dir, "--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		addr := "127.0.0.1:" + strconv.Itoa(port)
		waitFor(t, 10*time.Second, "redis-server "+addr, func() error {
			c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
			defer c.Close()
			return c.Ping(context.Background()).Err()
		})
		addrs = append(addrs, addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, addr := range addrs {
		waitFor(t, 20*time.Second, "cluster state ok at "+addr, func() error {
			c := redis.NewClient(&redis.Options{Addr: addr})
			defer c.Close()
			info, err := c.ClusterInfo(context.Background()).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("not ok yet")
			}
			return nil
		})
	}
	return addrs
}

// clusterPort finds a free port whose cluster bus port (port+10000) is free
// too.
func clusterPort(t testing.TB) int {
	for i := 0; i < 100; i++ {
		p := 20000 + rand.N(25000)
		ok := true
		for _, q := range []int{p, p + 10000} {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				ok = false
				break
			}
			_ = l.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatal("no free port pair for a cluster node")
	return 0
}

// waitFor polls check until it succeeds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

type clusterHarness struct {
	addrs []string
	admin *redis.ClusterClient
}

func newClusterHarness(ctx context.Context, t testing.TB) (locktest.Harness, error) {
	addrs := startCluster(t)
	return &clusterHarness{addrs: addrs, admin: redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})}, nil
}

func (h *clusterHarness) NewDriver(ctx context.Context) (driver.Driver, error) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: h.addrs, ContextTimeoutEnabled: true})
	d, err := New(c, nil)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	d.own = true
	return d, nil
}

func (h *clusterHarness) Kill(d driver.Driver) error {
	d.(*Driver).kill()
	return nil
}

func (h *clusterHarness) Drop(ctx context.Context, name string) error {
	_, err := redisscript.Drop(ctx, h.admin, redisscript.KeysFor(DefaultKeyPrefix, name))
	return err
}

func (h *clusterHarness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	_, err := redisscript.DropKind(ctx, h.admin, redisscript.KindKeysFor(DefaultKeyPrefix, name, k))
	return err
}

func (h *clusterHarness) Config() locktest.Config {
	return locktest.Config{TTL: time.Second, LockDelay: true, Clients: 3}
}

func (h *clusterHarness) Close() { _ = h.admin.Close() }

// TestClusterConformance runs the suite against a three-master Redis
// Cluster through a *redis.ClusterClient: a lock's keys share one slot by
// their hash tag, renewal sends one script call per lease pipelined per
// node, Inspect scans every master.
func TestClusterConformance(t *testing.T) {
	if os.Getenv("DLOCK_TEST_REDIS_URL") != "" {
		t.Skip("DLOCK_TEST_REDIS_URL points at an external server; the cluster test starts its own")
	}
	locktest.RunConformanceTests(t, newClusterHarness)
}

// TestClusterRenewSpreadsOverNodes renews leases whose keys live on every
// master in one Renew call.
func TestClusterRenewSpreadsOverNodes(t *testing.T) {
	addrs := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer c.Close()
	d, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var ls []driver.Lease
	slots := map[string]bool{}
	for i := 0; i < 300; i++ {
		req := driver.AcquireRequest{Name: fmt.Sprintf("spread-{%d}", i), Owner: "o", TTL: 5 * time.Second}
		g, err := d.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: 20 * time.Second})
		slot, err := c.ClusterKeySlot(ctx, redisscript.KeysFor(DefaultKeyPrefix, req.Name).Lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		fslot, _ := c.ClusterKeySlot(ctx, redisscript.KeysFor(DefaultKeyPrefix, req.Name).Fence).Result()
		if slot != fslot {
			t.Fatalf("%q: lock in slot %d, fence in slot %d", req.Name, slot, fslot)
		}
		slots[strconv.FormatInt(slot/5462, 10)] = true
	}
	if len(slots) < 3 {
		t.Fatalf("keys landed on %d of 3 masters' slot ranges; the test needs all", len(slots))
	}
	if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.ScriptFlush(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	errs, err := d.Renew(ctx, ls)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("lease %d: %v", i, e)
		}
	}
	infos, err := d.Inspect(ctx, "spread-")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != len(ls) {
		t.Fatalf("Inspect found %d of %d locks across the masters", len(infos), len(ls))
	}
	for _, in := range infos {
		if in.ExpiresIn < 10*time.Second {
			t.Fatalf("%+v: not renewed to 20s", in)
		}
	}
}

// TestClusterMultiAcquire: on a cluster, names whose keys share a hash slot
// are taken in one script; names in different slots are refused with
// ErrUnsupported, with nothing taken (the dlock package then goes one by
// one).
func TestClusterMultiAcquire(t *testing.T) {
	addrs := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer c.Close()
	d, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Find two names in one slot (a birthday search over 16384 slots).
	bySlot := map[int64]string{}
	var same []string
	for i := 0; same == nil; i++ {
		n := fmt.Sprintf("slot-%d", i)
		slot, err := c.ClusterKeySlot(ctx, redisscript.KeysFor(DefaultKeyPrefix, n).Lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := bySlot[slot]; ok {
			same = []string{o, n}
		}
		bySlot[slot] = n
	}
	req := func(n string) driver.AcquireRequest {
		return driver.AcquireRequest{Name: n, Owner: "multi", TTL: 10 * time.Second}
	}
	gs, err := d.TryAcquireMulti(ctx, []driver.AcquireRequest{req(same[0]), req(same[1])})
	if err != nil || len(gs) != 2 {
		t.Fatalf("names %v in one slot: %v, %v", same, gs, err)
	}
	for i, g := range gs {
		if _, err := d.Release(ctx, driver.Lease{Name: same[i], Owner: "multi", Token: g.Token, Handle: g.Handle}); err != nil {
			t.Fatal(err)
		}
	}
	other := "slot-other"
	for s, _ := c.ClusterKeySlot(ctx, redisscript.KeysFor(DefaultKeyPrefix, other).Lock).Result(); s == mustSlot(t, c, same[0]); s, _ = c.ClusterKeySlot(ctx, redisscript.KeysFor(DefaultKeyPrefix, other).Lock).Result() {
		other += "x"
	}
	if _, err := d.TryAcquireMulti(ctx, []driver.AcquireRequest{req(same[0]), req(other)}); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("names in two slots: %v, want ErrUnsupported", err)
	}
	for _, n := range []string{same[0], other} {
		if c.Exists(ctx, redisscript.KeysFor(DefaultKeyPrefix, n).Lock).Val() != 0 {
			t.Fatalf("%q taken by a refused multi-acquire", n)
		}
	}
}

func mustSlot(t *testing.T, c *redis.ClusterClient, name string) int64 {
	t.Helper()
	s, err := c.ClusterKeySlot(context.Background(), redisscript.KeysFor(DefaultKeyPrefix, name).Lock).Result()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
