package redlock

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redislane"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// laneEnv is a driver over three new servers whose clients have pools of
// poolSize connections (0: go-redis's default), and those clients.
func laneEnv(t *testing.T, poolSize int) (*Driver, []*redis.Client) {
	t.Helper()
	var cs []*redis.Client
	var ucs []redis.UniversalClient
	for _, s := range testserver.RedisN(t, 3, nil) {
		opt, err := redis.ParseURL(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		opt.ContextTimeoutEnabled, opt.MaxRetries, opt.PoolSize = true, -1, poolSize
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		cs, ucs = append(cs, c), append(ucs, c)
	}
	d, err := New(ucs, &Options{NodeTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d, cs
}

// pair takes req on d and releases it.
func pair(t *testing.T, d *Driver, req driver.AcquireRequest) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	g, err := d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	l := driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL}
	if _, err := d.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// poolGets is how many connections the clients' pools handed out so far.
func poolGets(cs []*redis.Client) uint32 {
	var n uint32
	for _, c := range cs {
		st := c.PoolStats()
		n += st.Hits + st.Misses
	}
	return n
}

// TestNodeLaneSkipsPool: back-to-back acquires and releases send each
// node's script calls on that node's lane, not through go-redis's pool
// (whose Get checks the connection with a system call each time). Before
// the lane, each pair took two connections from every node's pool.
func TestNodeLaneSkipsPool(t *testing.T) {
	d, cs := laneEnv(t, 0)
	req := driver.AcquireRequest{Name: "lane", Owner: "o", TTL: time.Minute}
	pair(t, d, req) // scripts loaded, lanes opened
	// A pause longer than redislane.Idle (5ms: a loaded machine, the race
	// detector's stop-the-world) sends one pair's calls back to the
	// pools, so a round may take a few; the pools would serve all
	// 2*pairs*3 calls of every round. A run that pauses that often in
	// each of the rounds is rare; a driver without its lanes fails each.
	const pairs, rounds = 50, 5
	var got []uint32
	for range rounds {
		before := poolGets(cs)
		for range pairs {
			pair(t, d, req)
		}
		gets := poolGets(cs) - before
		if gets <= 3*pairs/5 {
			return
		}
		got = append(got, gets)
	}
	t.Fatalf("%d pairs took %v connections from the nodes' pools in %d rounds; want (almost) none in one", pairs, got, rounds)
}

// TestNodeLaneGivesBack: an idle node lane gives its connection back to
// the pool by itself (redislane.GiveBack after its last call), Close gives
// back the lanes' connections, and a pool smaller than redislane.MinPool
// gets no lane, so that the driver never keeps a connection a small
// application pool needs.
func TestNodeLaneGivesBack(t *testing.T) {
	d, _ := laneEnv(t, 0)
	for _, nd := range d.nodes {
		// On a loaded machine an acquire's round trip may take more than
		// Idle (5ms), and the release after it would then use the pool and
		// give the lane's connection back: this test is about GiveBack.
		nd.lane.SetIdle(redislane.GiveBack / 2)
	}
	req := driver.AcquireRequest{Name: "lane-give-back", Owner: "o", TTL: time.Minute}
	kept := func() int {
		n := 0
		for _, nd := range d.nodes {
			if nd.lane.HasConn() {
				n++
			}
		}
		return n
	}
	pair(t, d, req)
	for _, nd := range d.nodes {
		nd.lane.SetLastCall(0)
	}
	pair(t, d, req)
	if kept() == 0 {
		t.Fatal("back-to-back calls used no node's lane")
	}
	testwait.Until(t, 10*redislane.GiveBack, "the idle lanes to give their connections back to the pools", func() bool { return kept() == 0 })

	for _, nd := range d.nodes {
		nd.lane.SetLastCall(0)
	}
	pair(t, d, req)
	if kept() == 0 {
		t.Fatal("back-to-back calls used no node's lane")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := kept(); n != 0 {
		t.Fatalf("%d node lanes kept their connections after Close", n)
	}

	small, _ := laneEnv(t, redislane.MinPool-1)
	for i, nd := range small.nodes {
		if nd.lane != nil {
			t.Errorf("node %d's pool of %d connections got a lane", i, redislane.MinPool-1)
		}
	}
	pair(t, small, req)
}
