package redlock

import (
	"context"
	"testing"
	"time"
)

// TestFanoutAllocs: a fan-out to 3 nodes hands each node call to a worker
// as its fan-out's record and the node's index, not as a closure per
// node. Before: 10 allocations per fan-out (3 of them the closures);
// after: 7 (the result channel, the shared record, and the node
// timeout's context and timer).
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
	if n := testing.AllocsPerRun(200, fan); n > maxFanoutAllocs {
		t.Fatalf("a fan-out to %d nodes costs %.1f allocations, want at most %d", len(d.nodes), n, maxFanoutAllocs)
	}
}

const maxFanoutAllocs = 7
