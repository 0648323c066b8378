package redlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// newClient opens a dlock client over a Redlock driver on srvs.
func newClient(t *testing.T, srvs []*testserver.Server, ttl time.Duration) *dlock.Client {
	t.Helper()
	d, err := openTest(context.Background(), redlockURL(srvs, testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(d, &dlock.Options{TTL: ttl, WaitMax: 50 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestOneOfThreeDown(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	a := newClient(t, srvs, 2*time.Second)
	b := newClient(t, srvs, 2*time.Second)
	ctx := ctxT(t, 20*time.Second)
	l0, err := a.NewMutex("one-down", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l0.Unlock(ctx)
	if err := srvs[2].Kill(); err != nil {
		t.Fatal(err)
	}
	l, err := a.NewMutex("one-down", nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("with 2 of 3 nodes up: %v; want a grant", err)
	}
	if l.Token() <= l0.Token() {
		t.Fatalf("token %d after %d", l.Token(), l0.Token())
	}
	if _, err := b.NewMutex("one-down", nil).TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("second client with 2 of 3 nodes up: %v; want ErrLocked", err)
	}
	// Renewal keeps the lease on the two live nodes.
	select {
	case <-l.Done():
		t.Fatalf("lease lost with 2 of 3 nodes up: %v", l.Err())
	case <-time.After(3 * time.Second):
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := b.NewMutex("one-down", nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("after release with 2 of 3 nodes up: %v", err)
	}
	_ = lb.Unlock(ctx)
}

func TestTwoOfThreeDownNeverGrants(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	a := newClient(t, srvs, time.Second)
	ctx := ctxT(t, 30*time.Second)
	if err := srvs[0].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := srvs[1].Kill(); err != nil {
		t.Fatal(err)
	}
	m := a.NewMutex("two-down", nil)
	for i := 0; i < 20; i++ {
		l, err := m.TryLock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
			t.Fatalf("attempt %d: granted (token %d) with 1 of 3 nodes up", i, l.Token())
		}
		if errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("attempt %d: %v; want an error saying the nodes are unreachable, not ErrLocked", i, err)
		}
		if !strings.Contains(err.Error(), "only 1 of 3 nodes answered") {
			t.Fatalf("attempt %d: %v; want it to say how many nodes answered", i, err)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if l, err := m.Lock(lctx); err == nil {
		t.Fatalf("Lock granted (token %d) with 1 of 3 nodes up", l.Token())
	}
	// Nothing is left behind on the surviving node.
	infos, err := a.Inspect(ctx, "")
	if err == nil {
		t.Fatalf("Inspect with 1 of 3 nodes up = %+v; want an error", infos)
	}
	// Opening a new driver refuses without a quorum.
	u, _ := url.Parse(redlockURL(srvs, ""))
	if d, err := OpenURL(ctx, u); err == nil {
		_ = d.Close()
		t.Fatal("OpenURL succeeded with 1 of 3 nodes reachable")
	} else if !strings.Contains(err.Error(), "only 1 of 3 nodes reachable") {
		t.Fatalf("OpenURL: %v", err)
	}
}

// TestPartitionedHolderLosesLease: a holder that can reach only a minority
// (the other nodes paused) cannot renew and loses its lease within its TTL,
// and nobody else gets the lock until it has expired on the majority.
func TestPartitionedHolderLosesLease(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	const ttl = time.Second
	a := newClient(t, srvs, ttl)
	b := newClient(t, srvs, ttl)
	ctx := ctxT(t, 30*time.Second)
	la, err := a.NewMutex("partition", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range srvs[1:] {
		if err := s.Pause(); err != nil {
			t.Fatal(err)
		}
	}
	paused := time.Now()
	resumed := false
	resume := func() {
		if resumed {
			return
		}
		resumed = true
		for _, s := range srvs[1:] {
			if err := s.Resume(); err != nil {
				t.Error(err)
			}
		}
	}
	defer resume()
	select {
	case <-la.Done():
	case <-time.After(ttl + 2*time.Second):
		t.Fatalf("holder cut off from the majority still holds %v after the pause (TTL %v)", time.Since(paused), ttl)
	}
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", la.Err())
	}
	if lost := time.Since(paused); lost > ttl+time.Second {
		t.Errorf("lease lost %v after the partition, TTL %v", lost, ttl)
	}
	// The other side cannot take it while the majority is unreachable.
	if l, err := b.NewMutex("partition", nil).TryLock(ctx); err == nil {
		t.Fatalf("granted (token %d) with 2 of 3 nodes paused", l.Token())
	}
	resume()
	lb, err := b.NewMutex("partition", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after the lost holder's %d", lb.Token(), la.Token())
	}
	_ = lb.Unlock(ctx)
}

// TestDelayedRestartNoTwoHolders follows the delayed-restart rule: a node
// that crashed without persistence comes back (empty) only after the TTL has
// passed. A holds the lock on exactly a quorum (nodes 0 and 1; node 2 is
// down), then node 0 crashes. While it stays down, A cannot renew on a
// quorum and loses its lease; so when node 0 (and node 2) come back empty,
// B's grant does not overlap A's.
func TestDelayedRestartNoTwoHolders(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	const ttl = time.Second
	a := newClient(t, srvs, ttl)
	b := newClient(t, srvs, ttl)
	ctx := ctxT(t, 30*time.Second)
	if err := srvs[2].Kill(); err != nil {
		t.Fatal(err)
	}
	la, err := a.NewMutex("restart", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srvs[0].Kill(); err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	// The operator waits out the TTL before restarting (checked below
	// against the lease's own loss, which must come first).
	select {
	case <-la.Done():
	case <-time.After(ttl + 2*time.Second):
		t.Fatalf("A still holds with 1 of 3 nodes up")
	}
	lostAfter := time.Since(crashed)
	for time.Since(crashed) < ttl+100*time.Millisecond {
		time.Sleep(10 * time.Millisecond) // the operator's delay, not a wait for a condition
	}
	for _, s := range []*testserver.Server{srvs[0], srvs[2]} {
		if err := s.Restart(true); err != nil {
			t.Fatal(err)
		}
	}
	lb, err := b.NewMutex("restart", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if la.Err() == nil {
		t.Fatal("two holders: B granted while A's lease is still valid")
	}
	t.Logf("A lost its lease %v after node 0 crashed; B granted after the delayed restart", lostAfter.Round(time.Millisecond))
	_ = lb.Unlock(ctx)
}

// TestFencingSurvivesOneEmptyNode: the token keeps rising when one node of
// three comes back empty, because the token was written back to a quorum.
func TestFencingSurvivesOneEmptyNode(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	ctx := ctxT(t, 30*time.Second)
	d, err := openTest(ctx, redlockURL(srvs, testNodeTimeout))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	req := driver.AcquireRequest{Name: "fence", Owner: "a", TTL: 5 * time.Second}
	var last uint64
	for i := 0; i < 5; i++ {
		g, err := d.TryAcquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if g.Token <= last {
			t.Fatalf("token %d after %d", g.Token, last)
		}
		last = g.Token
		if _, err := d.Release(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srvs[1].Restart(true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := d.TryAcquire(ctx, req)
		if err == nil {
			if g.Token <= last {
				t.Fatalf("token %d after a node restarted empty, last was %d", g.Token, last)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant after the restart: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling until the pool reconnects
	}
}

func TestURL(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	ctx := ctxT(t, 20*time.Second)
	hosts := []string{srvs[0].Addr(), srvs[1].Addr(), srvs[2].Addr()}
	d, err := openTest(ctx, "redlock://"+strings.Join(hosts, ",")+"/0?key_prefix=x:&node_timeout=20ms&pool_size=3")
	if err != nil {
		t.Fatal(err)
	}
	if d.prefix != "x:" || d.nodeTimeout != 20*time.Millisecond || d.Quorum() != 2 || len(d.nodes) != 3 {
		t.Errorf("driver from URL: prefix %q, node timeout %v, quorum %d, %d nodes", d.prefix, d.nodeTimeout, d.Quorum(), len(d.nodes))
	}
	_ = d.Close()
	// Bad input wraps driver.ErrInvalid (dlock.Open reports it as an
	// invalid URL, the CLI exits 64); unreachable nodes do not.
	for _, tc := range []struct {
		url, want string
		invalid   bool
	}{
		{"redlock://" + hosts[0] + "," + hosts[0] + "/0", "twice", true},
		{"redlock:///0", "no nodes", true},
		{"redlock://," + hosts[0] + "/0", "empty node", true},
		{"redlock://" + strings.Join(hosts, ",") + "/0?bogus=1", "bogus", true},
		{"redlock://" + strings.Join(hosts, ",") + "/0?node_timeout=fast", "node_timeout", true},
		{"redlock://" + strings.Join(hosts, ",") + "/0?tls=maybe", "tls", true},
		{"redlock://" + strings.Join(hosts, ",") + "/0?key_prefix=a{b", "KeyPrefix", true},
		{"redlock://:s3cr3t@" + strings.Join(hosts, ",") + "/0?pool_size=x", "pool_size", true},
		{"redlock://:s3cr3t@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/0", "only 0 of 3", false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		d, err := OpenURL(ctx, u)
		if err == nil {
			_ = d.Close()
			t.Errorf("%s: no error", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not mention %q", tc.url, err, tc.want)
		}
		if got := errors.Is(err, driver.ErrInvalid); got != tc.invalid {
			t.Errorf("%s: error %q: wraps driver.ErrInvalid = %v, want %v", tc.url, err, got, tc.invalid)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error shows the password: %v", tc.url, err)
		}
	}
	// Through dlock.Open, with a client-wide parameter.
	c, err := dlock.Open(ctx, "redlock://"+strings.Join(hosts, ",")+"/0?ttl=2s")
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.NewMutex("via-open", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	_ = c.Close()
}

// TestFiveNodesTolerateTwo: 5 nodes keep granting with 2 down, and refuse
// (with an error) with 3 down.
func TestFiveNodesTolerateTwo(t *testing.T) {
	srvs := testserver.RedisN(t, 5, nil)
	a := newClient(t, srvs, 2*time.Second)
	ctx := ctxT(t, 30*time.Second)
	for _, i := range []int{1, 3} {
		if err := srvs[i].Kill(); err != nil {
			t.Fatal(err)
		}
	}
	l, err := a.NewMutex("five", nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("with 3 of 5 nodes up: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srvs[4].Kill(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		l, err := a.NewMutex("five", nil).TryLock(ctx)
		if err == nil {
			t.Fatalf("granted (token %d) with 2 of 5 nodes up", l.Token())
		}
		if errors.Is(err, dlock.ErrLocked) || !strings.Contains(err.Error(), "only 2 of 5 nodes answered") {
			t.Fatalf("with 2 of 5 nodes up: %v", err)
		}
	}
}

// TestWaitWithANodePaused: with one node of three paused (it takes
// connections and requests but answers nothing), a waiting Lock returns
// when its context ends, give or take a node timeout, and a waiter is
// granted soon after the holder lets go. Before, a waiter subscribed the
// nodes one after another, each with the Lock's whole context, and the
// paused node's subscription held it for go-redis's dial timeout (5 s)
// or longer; a refused attempt waited for the paused node's answer and
// then for its release, and a Lock giving up waited for it to leave the
// queue: a 500 ms Lock took 1.2 s, and the waiter was not granted within
// 20 s.
func TestWaitWithANodePaused(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	const ttl = 2 * time.Second
	holder, waiter := newClient(t, srvs, ttl), newClient(t, srvs, ttl)
	name := "wait-paused"
	l, resume := holdWithNodePaused(t, srvs, holder, waiter, name)
	const nodeTimeout = 300 * time.Millisecond // testNodeTimeout
	for i := range 2 {
		testwait.EndsWithDeadline(t, 500*time.Millisecond, nodeTimeout, fmt.Sprintf("Lock %d while held", i), func(ctx context.Context) error {
			_, err := waiter.NewMutex(name, nil).Lock(ctx)
			return err
		})
	}
	got := testwait.Go(func() (*dlock.Lease, error) { return waiter.NewMutex(name, nil).Lock(ctxT(t, 20*time.Second)) })
	admin := redis.NewClient(&redis.Options{Addr: srvs[0].Addr()})
	defer admin.Close()
	channel := redisscript.KeysFor(DefaultKeyPrefix, name).Channel
	testwait.Until(t, 5*time.Second, "the waiter subscribed", func() bool {
		m, err := admin.PubSubNumSub(context.Background(), channel).Result()
		return err == nil && m[channel] > 0
	})
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	o := <-got
	if o.Err != nil {
		t.Fatalf("the waiter, after the release: %v", o.Err)
	}
	// The waiter's refused attempt, in flight at the release, waits out the
	// paused node twice (its answer, then the undo's release there), and
	// its first wait's subscriptions once: measured, about one node
	// timeout after the release (two before TestFirstWaitSubscribesAtOnce's
	// change).
	if d := o.At.Sub(released); d > 2*ttl {
		t.Errorf("the waiter was granted %v after the release (TTL %v)", d, ttl)
	}
	if err := o.V.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	resume()
}

// TestFirstWaitSubscribesAtOnce: with a node paused, a waiting Lock's
// first wait subscribes the release channel and its grant channel at once,
// each within the node timeout, so that it is queued on the live nodes
// about three node timeouts after it began: its refused attempt waits out
// the paused node twice (its answer, then the undo's release), and the
// subscriptions once. Before, the two subscriptions came one after the
// other: four node timeouts (4.0 s here, 3.0 s after).
func TestFirstWaitSubscribesAtOnce(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	const nodeTimeout = time.Second
	open := func() *dlock.Client {
		d, err := openTest(context.Background(), redlockURL(srvs, "node_timeout=1s"))
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: 10 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	holder, waiter := open(), open()
	name := "first-wait-paused"
	l, resume := holdWithNodePaused(t, srvs, holder, waiter, name)
	start := time.Now()
	got := make(chan error, 1)
	go func() {
		l, err := waiter.NewMutex(name, nil).Lock(ctxT(t, 30*time.Second))
		if err == nil {
			err = l.Unlock(context.Background())
		}
		got <- err
	}()
	queue := redisscript.KeysFor(DefaultKeyPrefix, name).Queue
	var admins []*redis.Client
	for _, i := range []int{0, 2} {
		a := redis.NewClient(&redis.Options{Addr: srvs[i].Addr()})
		defer a.Close()
		admins = append(admins, a)
	}
	testwait.Until(t, 15*time.Second, "the waiter queued on the live nodes", func() bool {
		for _, a := range admins {
			if n, err := a.ZCard(context.Background(), queue).Result(); err != nil || n == 0 {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	resume()
	t.Logf("queued %v after the Lock began", took)
	if took > 3*nodeTimeout+nodeTimeout/2 {
		t.Errorf("the waiter was queued %v after its Lock began; want about 3 node timeouts (%v)", took, 3*nodeTimeout)
	}
}

// holdWithNodePaused has holder take name, once both clients have reached
// every node, and then pauses srvs[1]. It returns the holder's lease and
// resume, which resumes the node (at the test's end too, if not called).
func holdWithNodePaused(t *testing.T, srvs []*testserver.Server, holder, waiter *dlock.Client, name string) (*dlock.Lease, func()) {
	t.Helper()
	for _, c := range []*dlock.Client{waiter, holder} {
		l, err := c.NewMutex(name, nil).TryLock(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	l, err := holder.NewMutex(name, nil).TryLock(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := srvs[1].Pause(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume := func() {
		once.Do(func() {
			if err := srvs[1].Resume(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(resume)
	return l, resume
}
