package redlock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/internal/redisscript"
)

// result is one node's answer to a fanned-out call.
type result[T any] struct {
	i   int
	v   T
	err error
}

// fanout runs fn on every node in parallel, each bounded by timeout, and
// returns a channel that receives the N results in the order they arrive.
// The calls are tracked, so Close waits for calls their caller stopped
// waiting for. It must be called only inside a call the gate admitted.
func fanout[T any](d *Driver, ctx context.Context, timeout time.Duration, fn func(ctx context.Context, n *node) (T, error)) <-chan result[T] {
	return fanoutTo(d, ctx, timeout, nil, fn)
}

// fanoutTo is fanout to the nodes listed (all nodes if which is nil).
func fanoutTo[T any](d *Driver, ctx context.Context, timeout time.Duration, which []int, fn func(ctx context.Context, n *node) (T, error)) <-chan result[T] {
	if which == nil {
		which = make([]int, len(d.nodes))
		for i := range which {
			which[i] = i
		}
	}
	out := make(chan result[T], len(which))
	d.gate.Add(len(which))
	// One deadline for all the node calls (they start together): one
	// timer rather than one per node.
	nctx, cancel := context.WithTimeout(ctx, timeout)
	if len(which) == 0 {
		cancel()
		return out
	}
	pending := &pendingCalls{cancel: cancel}
	pending.left.Store(int32(len(which)))
	for _, i := range which {
		n := d.nodes[i]
		go func() {
			defer d.gate.Done()
			v, err := fn(nctx, n)
			// A late answer still counts: validity is measured by the
			// dlock package, from the send.
			if err != nil && nctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("no answer within the %v node timeout: %w", timeout, err)
			}
			pending.done()
			out <- result[T]{i: i, v: v, err: err}
		}()
	}
	return out
}

// settle sets h.settled to a channel closed (and then dropped) once the
// pending results of an acquire that returned early (on a quorum) have
// arrived. It must be called inside an admitted call; Close waits for it.
// A queued waiter (ops.leave set) leaves the queue of the late nodes that
// did not grant.
func (d *Driver) settle(ctx context.Context, h *handle, ops lockOps, timeout time.Duration, results <-chan result[redisscript.AcquireResult], pending int) {
	if pending == 0 {
		return
	}
	done := make(chan struct{})
	h.settled.Store(&done)
	d.gate.Add(1)
	go func() {
		defer d.gate.Done()
		var leave []int
		for range pending {
			r := <-results
			if r.err != nil || !r.v.Granted {
				leave = append(leave, r.i)
			}
		}
		close(done)
		h.settled.Store(nil)
		if ops.leave != nil && len(leave) > 0 {
			d.leaveNodes(ctx, ops, leave, timeout)
		}
	}()
}

// pendingCalls cancels a fan-out's shared deadline when its last call
// returns.
type pendingCalls struct {
	left   atomic.Int32
	cancel context.CancelFunc
}

func (p *pendingCalls) done() {
	if p.left.Add(-1) == 0 {
		p.cancel()
	}
}
