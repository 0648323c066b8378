package quorum_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/memlock"
	"github.com/dlock/dlock/quorum"
)

var memSeq atomic.Int64

// memNodes returns n fresh in-process backends and a driver on each.
func memNodes(t testing.TB, n int) ([]*memlock.Backend, []*memlock.Driver) {
	t.Helper()
	var bs []*memlock.Backend
	var ds []*memlock.Driver
	for range n {
		b := memlock.NewBackend()
		bs = append(bs, b)
		ds = append(ds, b.NewDriver())
	}
	return bs, ds
}

func newMemQuorum(t testing.TB, ds []*memlock.Driver) *quorum.Driver {
	t.Helper()
	nodes := make([]driver.Driver, len(ds))
	for i, d := range ds {
		nodes[i] = d
	}
	q, err := quorum.New(nodes, &quorum.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// allFree waits until no node holds name (a release returns once a
// majority answered; the rest finish in the background).
func allFree(t testing.TB, bs []*memlock.Backend, name string) {
	t.Helper()
	testwait.Until(t, 10*time.Second, "every node free", func() bool {
		for _, b := range bs {
			if o, _ := b.Holder(name); o != "" {
				return false
			}
		}
		return true
	})
}

// TestNodeRaiseKeepsHolder checks the FenceRaiser contract the token rule
// rests on, on each kind of node: a raise while the lock is held leaves the
// holder's grant as it is (it renews, re-enters with its token and
// releases), and the next grant is above the raised value.
func TestNodeRaiseKeepsHolder(t *testing.T) {
	t.Parallel()
	kinds := map[string]func(t testing.TB) *testNode{
		"mem": func(t testing.TB) *testNode {
			return &testNode{kind: "mem", url: fmt.Sprintf("mem://raise-%d", memSeq.Add(1))}
		},
		"redis":  func(t testing.TB) *testNode { return redisNodes(t, 1)[0] },
		"sqlite": sqliteNode,
	}
	for kind, mk := range kinds {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			d, err := dlock.OpenDriver(ctx, mk(t).url)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			req := driver.AcquireRequest{Name: "raise-held", Owner: "a", TTL: 10 * time.Second}
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.(driver.FenceRaiser).RaiseFence(ctx, req.Name, driver.Exclusive, g.Token+100); err != nil {
				t.Fatal(err)
			}
			l := driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL}
			errs, err := d.Renew(ctx, []driver.Lease{l})
			if err != nil || errs[0] != nil {
				t.Fatalf("renew after a raise while held: %v %v", err, errs)
			}
			g2, err := d.TryAcquire(ctx, req)
			if err != nil || g2.Token != g.Token || g2.Count != 2 {
				t.Fatalf("re-entry after a raise while held: %+v %v, want token %d count 2", g2, err, g.Token)
			}
			for want := 1; want >= 0; want-- {
				if left, err := d.Release(ctx, l); err != nil || left != want {
					t.Fatalf("release after a raise while held: %d %v, want %d", left, err, want)
				}
			}
			g3, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: req.Name, Owner: "b", TTL: req.TTL})
			if err != nil || g3.Token <= g.Token+100 {
				t.Fatalf("next grant %+v %v, want a token above %d", g3, err, g.Token+100)
			}
		})
	}
}

// TestLostRepliesUndone: a node whose replies are lost may hold a grant;
// a quorum grant releases it there too, and a failed attempt undoes it on
// every node.
func TestLostRepliesUndone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bs, ds := memNodes(t, 3)
	q := newMemQuorum(t, ds)
	c := dlock.New(q, &dlock.Options{TTL: time.Minute})
	defer c.Close()
	lose := func(op string) error {
		if op == "acquire" {
			return errors.New("reply lost (test)")
		}
		return nil
	}
	ds[0].LoseReplies(lose)
	l, err := c.NewMutex("lost-one", nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with one node losing replies: %v", err)
	}
	if o, _ := bs[0].Holder("lost-one"); o != l.Owner() {
		t.Fatalf("node 0 holder %q, want the lease's %q (the grant took effect there)", o, l.Owner())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	allFree(t, bs, "lost-one")
	ds[1].LoseReplies(lose)
	if _, err := c.NewMutex("lost-two", nil).TryLock(ctx); err == nil || errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock with two nodes losing replies: %v, want an error", err)
	}
	allFree(t, bs, "lost-two")
}

// TestLeftoverNotReentered: a grant of the owner left on one node (an
// attempt whose undo never reached it) is not re-entered: the owner gets a
// fresh grant with a token above every earlier one, and its release frees
// that node too.
func TestLeftoverNotReentered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bs, ds := memNodes(t, 3)
	q := newMemQuorum(t, ds)
	c := dlock.New(q, &dlock.Options{TTL: 10 * time.Second})
	defer c.Close()
	const name = "leftover"
	// The leftover, taken on node 0 alone.
	lg, err := bs[0].NewDriver().TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "owner-x", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Grants since, on the two other nodes.
	var last uint64
	for range 3 {
		l, err := c.NewMutex(name, nil).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last = l.Token()
		_ = l.Unlock(ctx)
	}
	if last <= lg.Token {
		t.Fatalf("test set-up: grants since the leftover reached %d, not above its %d", last, lg.Token)
	}
	l, err := c.NewMutex(name, &dlock.MutexOptions{Owner: "owner-x"}).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Count() != 1 || l.Token() <= last {
		t.Fatalf("owner of a leftover got count %d token %d, want a fresh grant (count 1) above %d", l.Count(), l.Token(), last)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	allFree(t, bs, name)
}

// TestReentryKeepsToken: a re-entry returns the lease's token although the
// nodes' own tokens differ and the node that gave the token is down.
func TestReentryKeepsToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, ds := memNodes(t, 3)
	const name = "reentry"
	if err := ds[2].RaiseFence(ctx, name, driver.Exclusive, 100); err != nil {
		t.Fatal(err)
	}
	q := newMemQuorum(t, ds)
	c := dlock.New(q, &dlock.Options{TTL: 10 * time.Second})
	defer c.Close()
	opts := &dlock.MutexOptions{Owner: "owner-r"}
	l1, err := c.NewMutex(name, opts).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l1.Token() != 101 {
		t.Fatalf("token %d, want 101 (the largest node's)", l1.Token())
	}
	ds[2].FailCalls(func(string) error { return errors.New("down (test)") })
	l2, err := c.NewMutex(name, opts).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() != l1.Token() || l2.Count() != 2 {
		t.Fatalf("re-entry with the token's node down: token %d count %d, want %d and 2", l2.Token(), l2.Count(), l1.Token())
	}
	_ = l2.Unlock(ctx)
	_ = l1.Unlock(ctx)
}

// nofence is a driver without driver.FenceRaiser.
type nofence struct{ driver.Driver }

func init() {
	dlock.Register("nofence-test", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		return nofence{memlock.Named("nofence").NewDriver()}, nil
	})
}

func TestNewRefusesBadInput(t *testing.T) {
	t.Parallel()
	mem := func() driver.Driver { return memlock.NewBackend().NewDriver() }
	m := mem()
	cases := []struct {
		what  string
		nodes []driver.Driver
		want  error
		names string
	}{
		{"two nodes", []driver.Driver{mem(), mem()}, driver.ErrInvalid, "at least 3"},
		{"a nil node", []driver.Driver{mem(), nil, mem()}, driver.ErrInvalid, "node 1"},
		{"a node twice", []driver.Driver{m, mem(), m}, driver.ErrInvalid, "node 2"},
		{"a node without FenceRaiser", []driver.Driver{mem(), mem(), nofence{mem()}}, driver.ErrUnsupported, "node 2"},
	}
	for _, tc := range cases {
		_, err := quorum.New(tc.nodes, nil)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.names) {
			t.Errorf("%s: %v, want %v naming %q", tc.what, err, tc.want, tc.names)
		}
	}
	if _, err := quorum.New([]driver.Driver{mem(), mem(), mem()}, &quorum.Options{NodeTimeout: -1}); !errors.Is(err, driver.ErrInvalid) {
		t.Errorf("negative NodeTimeout: %v, want ErrInvalid", err)
	}
}

func TestOpenURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	node := func(u string) string { return "node=" + url.QueryEscape(u) }
	seq := memSeq.Add(1)
	mem := func(i int) string { return node(fmt.Sprintf("mem://open-%d-%d", seq, i)) }
	good := "quorum:?" + mem(0) + "&" + mem(1) + "&" + mem(2)

	c, err := dlock.Open(ctx, good+"&node_timeout=300ms&ttl=5s")
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.NewMutex("open", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	_ = c.Close()

	const pw = "s3cr3t-pw"
	cases := []struct {
		what, url string
		want      error
		says      string
	}{
		{"two nodes", "quorum:?" + mem(0) + "&" + mem(1), driver.ErrInvalid, "at least 3"},
		{"nodes in the host", "quorum://h1,h2,h3", driver.ErrInvalid, "node= parameters"},
		{"unknown parameter", good + "&nodes=3", driver.ErrInvalid, `"nodes"`},
		{"bad node_timeout", good + "&node_timeout=fast", driver.ErrInvalid, "node_timeout"},
		{"unparsable node", "quorum:?" + mem(0) + "&" + mem(1) + "&" + node("redis://u:"+pw+"@h:port/0"), driver.ErrInvalid, "node 2"},
		{"node without scheme", "quorum:?" + mem(0) + "&" + mem(1) + "&" + node("h1:6379"), driver.ErrInvalid, "node 2"},
		{"unknown scheme", good + "&" + node("nosuch://x"), driver.ErrInvalid, "node 3"},
		{"duplicate node", good + "&" + mem(1), driver.ErrInvalid, "node 3 (mem://open"},
		{"same server", "quorum:?" + mem(0) + "&" + node("redis://u:"+pw+"@127.0.0.1:1/0") + "&" + node("redis://127.0.0.1:1/1"), driver.ErrInvalid, "node 2 (redis://127.0.0.1:1/1) is the same as node 1 (redis://u:xxxxx@127.0.0.1:1/0)"},
		{"client parameter on a node", "quorum:?" + mem(0) + "&" + mem(1) + "&" + node(fmt.Sprintf("mem://open-%d-3?ttl=1s", seq)), driver.ErrInvalid, "ttl"},
		{"node without FenceRaiser", "quorum:?" + mem(0) + "&" + mem(1) + "&" + node("nofence-test://x"), driver.ErrUnsupported, "node 2 (nofence-test://x"},
		{"two unreachable nodes with a password", "quorum:?" + mem(0) + "&" + node("redis://u:"+pw+"@127.0.0.1:1/0") + "&" + node("redis://u:"+pw+"@127.0.0.1:2/0"), nil, "2 of 3 nodes could not be opened, a quorum is 2: node 1 (redis://u:xxxxx@127.0.0.1:1/0)"},
	}
	for _, tc := range cases {
		c, err := dlock.Open(ctx, tc.url)
		if err == nil {
			_ = c.Close()
			t.Errorf("%s: opened", tc.what)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, err, tc.want)
		}
		if !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %q does not say %q", tc.what, err, tc.says)
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("%s: %q shows the password", tc.what, err)
		}
	}
}

// sessioned is a memlock node whose grants live on a session it can lose,
// as a session-bound backend's (a pinned SQL connection) do: the grants are
// dropped on the backend and Grant.Lost closes.
type sessioned struct {
	*memlock.Driver
	ctx  context.Context
	lose context.CancelCauseFunc
}

func newSessioned(d *memlock.Driver) *sessioned {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &sessioned{Driver: d, ctx: ctx, lose: cancel}
}

func (s *sessioned) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := s.Driver.TryAcquire(ctx, req)
	if err == nil {
		g.Lost, g.Cause = s.ctx.Done(), func() error { return context.Cause(s.ctx) }
	}
	return g, err
}

// twoSessioned returns three memlock nodes, the first two session-bound,
// and a quorum driver over them closed with the test.
func twoSessioned(t *testing.T) ([]*memlock.Backend, *sessioned, *sessioned, *quorum.Driver) {
	t.Helper()
	bs, ds := memNodes(t, 3)
	s0, s1 := newSessioned(ds[0]), newSessioned(ds[1])
	q, err := quorum.New([]driver.Driver{s0, s1, ds[2]}, &quorum.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return bs, s0, s1, q
}

// TestLostWhenMajorityLost: the grant's Lost closes once a majority of its
// nodes lost it, without waiting for a renewal.
func TestLostWhenMajorityLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bs, s0, s1, q := twoSessioned(t)
	const name = "lost"
	g, err := q.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The acquire returns on a majority's answers; the third may come later.
	testwait.Until(t, 10*time.Second, "every node's grant joining the lease", func() bool { return quorum.HeldBy(g) == 3 })
	sessionLost := fmt.Errorf("session ended (test): %w", driver.ErrSessionLost)
	bs[0].Drop(name)
	s0.lose(sessionLost)
	notLost(t, g, "with one node of three gone")
	bs[1].Drop(name)
	s1.lose(sessionLost)
	isLost(t, g, "lease not lost with two nodes of three gone (before its renewal)")
}

// lateQuorum returns a quorum driver over three session-bound memlock
// nodes, and a grant of it that the third node, slowed by delay, had not
// answered when the acquire returned.
func lateQuorum(t *testing.T, delay time.Duration) ([]*sessioned, driver.Grant) {
	t.Helper()
	_, ds := memNodes(t, 3)
	ss := []*sessioned{newSessioned(ds[0]), newSessioned(ds[1]), newSessioned(ds[2])}
	q, err := quorum.New([]driver.Driver{ss[0], ss[1], ss[2]}, &quorum.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	ds[2].DelayCalls(delay)
	g, err := q.TryAcquire(context.Background(), driver.AcquireRequest{Name: "late", Owner: "o", TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if n := quorum.HeldBy(g); n != 2 {
		t.Fatalf("the acquire returned with %d nodes holding, want the 2 quick ones: the test did not set up what it means to", n)
	}
	if g.Lost == nil {
		t.Fatal("no Lost channel: every node is session-bound")
	}
	return ss, g
}

// isLost fails the test with what unless g's Lost closes within 5s with a
// Cause that wraps ErrSessionLost.
func isLost(t *testing.T, g driver.Grant, what string) {
	t.Helper()
	select {
	case <-g.Lost:
	case <-time.After(5 * time.Second):
		t.Fatal(what)
	}
	if err := g.Cause(); !errors.Is(err, driver.ErrSessionLost) {
		t.Fatalf("Cause = %v, want ErrSessionLost", err)
	}
}

// notLost fails the test if g's Lost closes within 300ms.
func notLost(t *testing.T, g driver.Grant, what string) {
	t.Helper()
	select {
	case <-g.Lost:
		t.Fatalf("lost %s: %v", what, g.Cause())
	case <-time.After(300 * time.Millisecond):
	}
}

// TestLateGrantCountsAgainstLoss: a node whose grant came after the
// acquire returned holds the lease as much as the others: losing one of the
// two nodes that answered first leaves a majority, and the late node's own
// loss is watched from then on. (The loss watch counted only the first
// answers, and ended the lease at the first node's loss:
// TestLostWhenMajorityLost failed so when a node answered late under load.)
func TestLateGrantCountsAgainstLoss(t *testing.T) {
	t.Parallel()
	sessionLost := fmt.Errorf("session ended (test): %w", driver.ErrSessionLost)
	ss, g := lateQuorum(t, testNodeTimeout/4)
	testwait.Until(t, 10*time.Second, "the late node's grant joining the lease", func() bool { return quorum.HeldBy(g) == 3 })
	ss[0].lose(sessionLost)
	notLost(t, g, "with one node of three gone")
	ss[2].lose(sessionLost)
	isLost(t, g, "not lost with two nodes of three gone, the late one among them")
	if err := g.Cause(); !errors.Is(err, driver.ErrSessionLost) || !strings.Contains(err.Error(), "2 of the 3 nodes") {
		t.Fatalf("Cause = %v, want the loss on 2 of the 3 nodes", err)
	}
}

// TestLossBeforeLateAnswer: a node lost while another has not answered
// yet ends the lease at once when the nodes known to hold it are fewer than
// a majority: the late answer may be a refusal (another client's grant),
// and waiting for it would leave both believing they hold the lock for up
// to a node timeout.
func TestLossBeforeLateAnswer(t *testing.T) {
	t.Parallel()
	_, ds := memNodes(t, 3)
	s0, s1 := newSessioned(ds[0]), newSessioned(ds[1])
	released := make(chan struct{})
	close(released)
	n2 := &stallNode{Driver: ds[2], stallAt: 1, answer: make(chan struct{}), release: released}
	q, err := quorum.New([]driver.Driver{s0, s1, n2}, &quorum.Options{NodeTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	defer close(n2.answer)
	g, err := q.TryAcquire(context.Background(), driver.AcquireRequest{Name: "late", Owner: "o", TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s0.lose(fmt.Errorf("session ended (test): %w", driver.ErrSessionLost))
	isLost(t, g, "not lost within 5s with one of the two nodes that had answered gone, the third not answering")
}

// TestLostAtGrant: a grant whose nodes' sessions ended as they granted it,
// leaving fewer than a majority, is lost at once: the watch does not wait
// for a loss that has already happened.
func TestLostAtGrant(t *testing.T) {
	t.Parallel()
	_, s0, s1, q := twoSessioned(t)
	sessionLost := fmt.Errorf("session ended (test): %w", driver.ErrSessionLost)
	s0.lose(sessionLost)
	s1.lose(sessionLost)
	g, err := q.TryAcquire(context.Background(), driver.AcquireRequest{Name: "lost-at-grant", Owner: "o", TTL: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	isLost(t, g, "not lost within 5s, with two of three nodes' sessions ended as they granted")
}

// TestSlowNodeReleased: a node slower than the others still gets the
// lease's release after Unlock has returned (on the majority's answers),
// whether it had granted by then or not.
func TestSlowNodeReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bs, ds := memNodes(t, 3)
	q := newMemQuorum(t, ds)
	c := dlock.New(q, &dlock.Options{TTL: time.Minute})
	defer c.Close()
	ds[0].DelayCalls(300 * time.Millisecond)
	for _, name := range []string{"slow-early", "slow-late"} {
		l, err := c.NewMutex(name, nil).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if name == "slow-late" {
			// Unlock only once the slow node has granted too.
			testwait.Until(t, 10*time.Second, "the slow node's grant", func() bool {
				o, _ := bs[0].Holder(name)
				return o == l.Owner()
			})
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		allFree(t, bs, name)
	}
}

// enteringNode counts the TryAcquire calls that reach the node driver.
type enteringNode struct {
	*memlock.Driver
	n *atomic.Int32
}

func (e enteringNode) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	e.n.Add(1)
	return e.Driver.TryAcquire(ctx, req)
}

// TestCancelledAcquireLeavesNothing: a TryAcquire whose caller gives up
// while its requests are still on their way returns only once they have
// answered (each within the node timeout) and what they granted is undone. Before, it returned at once
// and undid late grants in the background: a request delayed past the
// holder's release was granted after the caller had gone, and the lock
// stayed taken until that undo got there (locktest's
// CancelWaitingLeavesNothing failed on Redis nodes under load).
func TestCancelledAcquireLeavesNothing(t *testing.T) {
	bs, as := memNodes(t, 3)
	var bds []*memlock.Driver
	for _, b := range bs {
		bds = append(bds, b.NewDriver())
	}
	qa := newMemQuorum(t, as)
	defer qa.Close()
	var entered atomic.Int32
	bnodes := make([]driver.Driver, len(bds))
	for i, d := range bds {
		bnodes[i] = enteringNode{d, &entered}
	}
	qb, err := quorum.New(bnodes, &quorum.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	ctx := context.Background()
	name := fmt.Sprintf("cancelled-%d", memSeq.Add(1))
	ga, err := qa.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// B's requests wait at every node until resumed; B gives up first.
	for _, d := range bds {
		d.Pause()
	}
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := qb.TryAcquire(bctx, driver.AcquireRequest{Name: name, Owner: "b", TTL: 10 * time.Second})
		done <- err
	}()
	// B gives up once its requests are on their way (a call on an
	// ended context sends nothing).
	testwait.Until(t, 5*time.Second, "B's requests sent", func() bool { return entered.Load() == int32(len(bds)) })
	cancel()
	// A releases, then B's requests reach the nodes: a node grants B unless
	// B's call already ended them.
	if _, err := qa.Release(ctx, driver.Lease{Name: name, Owner: "a", Token: ga.Token, Handle: ga.Handle, TTL: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("the cancelled TryAcquire returned (%v) while its requests were still held at the nodes: "+
			"what they grant once let through would be left to a background undo", err)
	case <-time.After(200 * time.Millisecond):
		// It waits for its requests' answers: let them through (a node
		// grants B now that A released; B must undo that before returning).
	}
	for _, d := range bds {
		d.Resume()
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled TryAcquire was granted")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled TryAcquire did not return")
	}
	for i, b := range bs {
		if o, _ := b.Holder(name); o != "" {
			t.Errorf("node %d: %q holds %q after its cancelled TryAcquire returned", i, o, name)
		}
	}
}

// lostReplyNode is a node whose first TryAcquire, once the node has
// decided, answers only when the test closes answer, and then as a lost
// reply; its Releases wait until the test closes release.
type lostReplyNode struct {
	*memlock.Driver
	answer, release    chan struct{}
	acquires, releases atomic.Int32
}

func (n *lostReplyNode) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if n.acquires.Add(1) > 1 {
		return n.Driver.TryAcquire(ctx, req)
	}
	_, _ = n.Driver.TryAcquire(ctx, req)
	<-n.answer
	return driver.Grant{}, errors.New("connection reset by peer")
}

func (n *lostReplyNode) Release(ctx context.Context, l driver.Lease) (int, error) {
	<-n.release
	defer n.releases.Add(1)
	return n.Driver.Release(ctx, l)
}

// TestLateUndoDoesNotTakeTheNextGrant: a refused attempt whose reply from
// one node is lost releases the owner there in the background once the
// node answers, by owner alone (the token is unknown). The owner's next
// attempt waits for that release: sent after it, the release took away the
// grant the next attempt had just got on that node, and with it, unseen,
// one node of the new lease's majority.
func TestLateUndoDoesNotTakeTheNextGrant(t *testing.T) {
	bs, as := memNodes(t, 3)
	qa := newMemQuorum(t, as)
	defer qa.Close()
	ln := &lostReplyNode{Driver: bs[2].NewDriver(), answer: make(chan struct{}), release: make(chan struct{})}
	qb, err := quorum.New([]driver.Driver{bs[0].NewDriver(), bs[1].NewDriver(), ln}, &quorum.Options{NodeTimeout: testNodeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	ctx := context.Background()
	name := fmt.Sprintf("late-undo-%d", memSeq.Add(1))
	const ttl = 10 * time.Second
	gx, err := qa.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "x", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	reqB := driver.AcquireRequest{Name: name, Owner: "b", TTL: ttl}
	// Refused by nodes 0 and 1 while node 2 has not answered.
	if _, err := qb.TryAcquire(ctx, reqB); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("b's first attempt: %v, want ErrLocked", err)
	}
	if _, err := qa.Release(ctx, driver.Lease{Name: name, Owner: "x", Token: gx.Token, Handle: gx.Handle, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	close(ln.answer) // node 2's refusal of b comes back as a lost reply
	// b's next attempt. Had it not waited for the late undo, it would be
	// granted on every node at once, before that undo's release to node 2.
	nextGrantKept(t, bs, qb, ln, reqB, "the late undo of b's refused attempt")
}

// stallNode is a node whose acquire number stallAt (from 1) waits, before
// it reaches the node, until the test closes answer; its Releases wait until
// the test closes release.
type stallNode struct {
	*memlock.Driver
	stallAt            int32
	answer, release    chan struct{}
	acquires, answered atomic.Int32
}

func (n *stallNode) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if n.acquires.Add(1) == n.stallAt {
		select {
		case <-n.answer:
		case <-ctx.Done():
			return driver.Grant{}, ctx.Err()
		}
	}
	defer n.answered.Add(1)
	return n.Driver.TryAcquire(ctx, req)
}

func (n *stallNode) Release(ctx context.Context, l driver.Lease) (int, error) {
	select {
	case <-n.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return n.Driver.Release(ctx, l)
}

// TestStragglersDoNotRefuseTheNextAttempt: a refused attempt left a request
// on its way to node 2 (a slow node, a new connection), granted there once
// the holder x has released, while its undo is on its way; node 1 is still
// held by y (as by a holder whose Unlock returned on a majority, its
// release to node 1 still on its way). The next attempt, granted by node 0
// alone, would have had a majority but for the driver's own straggler: it
// waits for that straggler's undo and tries again, where before it was
// refused (locktest's Reentrancy over Redis, PostgreSQL and SQLite nodes,
// now and then under load). An attempt refused by a majority of holders is
// not held up by a straggler, as it would not be by a hung node.
func TestStragglersDoNotRefuseTheNextAttempt(t *testing.T) {
	bs, as := memNodes(t, 3)
	qa := newMemQuorum(t, as)
	defer qa.Close()
	n2 := &stallNode{Driver: bs[2].NewDriver(), stallAt: 1, answer: make(chan struct{}), release: make(chan struct{})}
	n0 := bs[0].NewDriver()
	qb, err := quorum.New([]driver.Driver{n0, bs[1].NewDriver(), n2}, &quorum.Options{NodeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer qb.Close()
	var open2 sync.Once
	let2 := func() { open2.Do(func() { close(n2.release) }) }
	defer let2() // on a failure, before Close waits for the undo
	var answer2 sync.Once
	defer answer2.Do(func() { close(n2.answer) })
	ctx := context.Background()
	name := fmt.Sprintf("stragglers-%d", memSeq.Add(1))
	const ttl = time.Minute
	gx, err := qa.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "x", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	attempt := func(owner string, within time.Duration) (driver.Grant, error) {
		ctx, cancel := context.WithTimeout(ctx, within)
		defer cancel()
		return qb.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: owner, TTL: ttl})
	}
	// b1's request to node 2 stalls; b2, refused by x everywhere, is not
	// held up by it.
	if _, err := attempt("b1", 5*time.Second); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("b1 while x holds the lock: %v, want ErrLocked", err)
	}
	testwait.Until(t, 5*time.Second, "b1's request at node 2", func() bool { return n2.acquires.Load() == 1 })
	if _, err := attempt("b2", 5*time.Second); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("b2 while x holds the lock: %v, want ErrLocked", err)
	}
	testwait.Until(t, 5*time.Second, "node 2's answer to b2", func() bool { return n2.answered.Load() == 1 })
	if _, err := qa.Release(ctx, driver.Lease{Name: name, Owner: "x", Token: gx.Token, Handle: gx.Handle, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "x's release on every node", func() bool {
		for _, b := range bs {
			if o, _ := b.Holder(name); o == "x" {
				return false
			}
		}
		return true
	})
	if _, err := as[1].TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "y", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	answer2.Do(func() { close(n2.answer) })
	testwait.Until(t, 5*time.Second, "the straggler's grant", func() bool {
		o, _ := bs[2].Holder(name)
		return o == "b1"
	})
	// Its undo is held back: b3 must wait for it, not be refused. Node 0,
	// the one that grants b3, answers last: b3's attempt must hear it out
	// before it can tell that a majority would have granted.
	n0.DelayCalls(50 * time.Millisecond)
	if _, err := attempt("b3", 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("b3 with the straggler's undo held back: %v, want to wait for it (the context's deadline)", err)
	}
	done := make(chan error, 1)
	go func() {
		g, err := attempt("b3", 10*time.Second)
		if err == nil {
			_, err = qb.Release(ctx, driver.Lease{Name: name, Owner: "b3", Token: g.Token, Handle: g.Handle, TTL: ttl})
		}
		done <- err
	}()
	let2() // the undo on node 2, then b3's requests go out
	if err := <-done; err != nil {
		t.Fatalf("b3 once b1's straggler was undone: %v, want a grant", err)
	}
}

// nextGrantKept makes req's next attempt on qb, whose node 2 is ln, while a
// release by req's owner alone is held back on ln: the attempt must wait
// for that release (it returns the context's deadline, and is made again
// once the release went through) or be granted. Either way, every node of
// bs must then hold the lock for req's owner: what must not have taken the
// grant on node 2 away is named by what.
func nextGrantKept(t *testing.T, bs []*memlock.Backend, qb *quorum.Driver, ln *lostReplyNode, req driver.AcquireRequest, what string) {
	t.Helper()
	ctx := context.Background()
	ctx2, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	g, err := qb.TryAcquire(ctx2, req)
	cancel()
	close(ln.release)
	testwait.Until(t, 5*time.Second, "the release on node 2", func() bool { return ln.releases.Load() >= 1 })
	if err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s's next attempt: %v, want a grant or, waiting for the release on node 2, the context's deadline", req.Owner, err)
		}
		if g, err = qb.TryAcquire(ctx, req); err != nil {
			t.Fatalf("%s's attempt after the release on node 2: %v", req.Owner, err)
		}
	}
	for i, b := range bs {
		if owner, _ := b.Holder(req.Name); owner != req.Owner {
			t.Errorf("node %d is held by %q, not %s, after %s's grant: %s took the grant away", i, owner, req.Owner, req.Owner, what)
		}
	}
	if _, err := qb.Release(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle, TTL: req.TTL}); err != nil {
		t.Fatal(err)
	}
}

// TestReleasedLeaseLateReleaseDoesNotTakeTheNextGrant: a lease granted by
// nodes 0 and 1 while node 2, held by x, refused it in a reply that was
// lost. The lease's Release goes to node 2 by owner alone (the token is
// unknown), and outlives the call: sent from Release itself when the lost
// reply came before it (early), or from lateAnswers once it comes after
// it. The owner's next attempt waits for that release: sent after the
// attempt, it took away the grant the attempt got on node 2.
func TestReleasedLeaseLateReleaseDoesNotTakeTheNextGrant(t *testing.T) {
	for _, early := range []bool{true, false} {
		t.Run(fmt.Sprintf("reply-before-release=%v", early), func(t *testing.T) {
			bs, _ := memNodes(t, 3)
			ln := &lostReplyNode{Driver: bs[2].NewDriver(), answer: make(chan struct{}), release: make(chan struct{})}
			qb, err := quorum.New([]driver.Driver{bs[0].NewDriver(), bs[1].NewDriver(), ln}, &quorum.Options{NodeTimeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer qb.Close()
			ctx := context.Background()
			name := fmt.Sprintf("late-release-%d", memSeq.Add(1))
			const ttl = 10 * time.Second
			x := bs[2].NewDriver()
			defer x.Close()
			gx, err := x.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "x", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if early {
				close(ln.answer)
			}
			reqB := driver.AcquireRequest{Name: name, Owner: "b", TTL: ttl}
			g1, err := qb.TryAcquire(ctx, reqB)
			if err != nil {
				t.Fatalf("b's first attempt: %v", err)
			}
			if _, err := qb.Release(ctx, driver.Lease{Name: name, Owner: "b", Token: g1.Token, Handle: g1.Handle, TTL: ttl}); err != nil {
				t.Fatalf("b's release: %v", err)
			}
			if _, err := x.Release(ctx, driver.Lease{Name: name, Owner: "x", Token: gx.Token, Handle: gx.Handle, TTL: ttl}); err != nil {
				t.Fatal(err)
			}
			if !early {
				close(ln.answer)
			}
			// b's next attempt. Had it not waited for the release to node 2,
			// it would be granted on every node, before that release.
			nextGrantKept(t, bs, qb, ln, reqB, "the first lease's release by owner")
		})
	}
}
