package redlock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TestFanoutAllocs: a fan-out to 3 nodes hands each node call to a worker
// as its fan-out's record and the node's index, not as a closure per
// node. Before: 10 allocations per fan-out (3 of them the closures);
// after: 7 (the result channel, the shared record, and the node
// timeout's context and timer); 3 since the node calls' context is part of
// the record and makes its timer only if asked for Done (see nodeCtx).
func TestFanoutAllocs(t *testing.T) {
	d, _ := laneEnv(t, 0)
	ctx := context.Background()
	noop := func(ctx context.Context, n *node) (int, error) { return n.i, nil }
	fan := func() {
		if !d.gate.Enter() {
			t.Fatal("closed")
		}
		defer d.gate.Exit()
		out := fanout(d, ctx, time.Second, noop)
		for range d.nodes {
			<-out
		}
	}
	for range 10 {
		fan() // workers started
	}
	n := testing.AllocsPerRun(200, fan)
	t.Logf("%.1f allocations per fan-out", n)
	if n > maxFanoutAllocs {
		t.Fatalf("a fan-out to %d nodes costs %.1f allocations, want at most %d", len(d.nodes), n, maxFanoutAllocs)
	}
}

const maxFanoutAllocs = 3

// doneCounter is a cancellable context that counts the calls of its Done.
type doneCounter struct {
	context.Context
	calls atomic.Int32
}

func (c *doneCounter) Done() <-chan struct{} {
	c.calls.Add(1)
	return c.Context.Done()
}

// TestNodeCallsLeaveDoneAlone: an uncontended Acquire+Release neither asks
// its context for Done nor arms a timer per fan-out: the node timeout is
// the node calls' deadline (go-redis's connection deadlines), and the
// timer context behind Done is made only when something asks (see
// nodeCtx). Asking the caller's context for Done is what makes the dlock
// package build its Lock's cancel machinery and its Unlock's timer.
// Before: context.WithTimeout per fan-out asked it on every Acquire and
// Release (9-10 times per Acquire+Release).
func TestNodeCallsLeaveDoneAlone(t *testing.T) {
	d, _ := laneEnv(t, 0)
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := driver.AcquireRequest{Name: "done-alone", Owner: "owner", TTL: 30 * time.Second}
	op := func(ctx context.Context) {
		for _, n := range d.nodes {
			n.lane.SetLastCall(0)
		}
		g, err := d.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		l := driver.Lease{Name: req.Name, Owner: req.Owner, TTL: req.TTL, Token: g.Token, Handle: g.Handle}
		if _, err := d.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	// The first calls take the nodes' lanes' connections from the pools,
	// which asks for Done, and so does a call that finds its lane given
	// back (more than 5ms after the one before it on a loaded machine).
	for range 20 {
		op(parent)
	}
	const ops = 40
	asked := 0
	for range ops {
		ctx := &doneCounter{Context: parent}
		op(ctx)
		if ctx.calls.Load() > 0 {
			asked++
		}
	}
	if asked > ops/4 {
		t.Fatalf("%d of %d uncontended Acquire+Release asked their context for Done, want at most %d", asked, ops, ops/4)
	}
}

// TestNodeCtxDeadline: a node call that does ask for Done sees it closed
// at the node timeout, and its error says so; the node calls' deadline is
// the fan-out's ctx's when that is earlier; once the calls ended their
// context is cancelled.
func TestNodeCtxDeadline(t *testing.T) {
	d, _ := laneEnv(t, 0)
	if !d.gate.Enter() {
		t.Fatal("closed")
	}
	defer d.gate.Exit()
	var kept atomic.Pointer[context.Context]
	wait := func(ctx context.Context, n *node) (int, error) {
		kept.Store(&ctx)
		<-ctx.Done()
		return 0, ctx.Err()
	}
	start := time.Now()
	out := fanout(d, context.Background(), 50*time.Millisecond, wait)
	for range d.nodes {
		r := <-out
		if !errors.Is(r.err, context.DeadlineExceeded) || !strings.Contains(r.err.Error(), "node timeout") {
			t.Fatalf("node %d: %v, want the node timeout's DeadlineExceeded", r.i, r.err)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the node calls took %v with a 50ms node timeout", took)
	}
	if err := (*kept.Load()).Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the node calls' context after they ended: %v", err)
	}

	dl := time.Now().Add(20 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	got := fanout(d, ctx, time.Hour, func(ctx context.Context, n *node) (time.Time, error) {
		t, _ := ctx.Deadline()
		return t, nil
	})
	for range d.nodes {
		if r := <-got; !r.v.Equal(dl) {
			t.Fatalf("node %d: deadline %v, want the caller's %v", r.i, r.v, dl)
		}
	}

	out = fanout(d, context.Background(), time.Hour, func(ctx context.Context, n *node) (int, error) {
		kept.Store(&ctx)
		return 0, nil
	})
	for range d.nodes {
		<-out
	}
	if err := (*kept.Load()).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the node calls' context after they ended: %v, want Canceled", err)
	}
}

// TestCountdown: a countdown is done once as many results as it was made
// for were sent, not before, and later ones leave it done.
func TestCountdown(t *testing.T) {
	c := newCountdown(2)
	c.sent()
	select {
	case <-c.done:
		t.Fatal("done after 1 of 2")
	default:
	}
	c.sent()
	select {
	case <-c.done:
	default:
		t.Fatal("not done after 2 of 2")
	}
	c.sent() // a third answer (an acquire waits for the first 2 of 3)
}
