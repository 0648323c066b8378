package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/memlock"
)

// rpcLike is a memlock driver, made a Queuer, whose calls derive a
// cancellable context from theirs through a value, as a gRPC client does
// with its metadata (etcd, ZooKeeper's clients alike): the context package
// starts a goroutine to watch the parent's Done for such a child unless it
// finds the parent's cancelCtx.
// Its grants are bound to one session's loss channel, lost.
type rpcLike struct {
	*memlock.Driver
	lost chan struct{}
}

type rpcKey struct{}

func rpcCall(ctx context.Context) func() {
	_, cancel := context.WithCancel(context.WithValue(ctx, rpcKey{}, "md"))
	return cancel
}

func (d rpcLike) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	return d.TryAcquire(ctx, req)
}

func (d rpcLike) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	defer rpcCall(ctx)()
	g, err := d.Driver.TryAcquire(ctx, req)
	g.Lost = d.lost
	return g, err
}

func (d rpcLike) Release(ctx context.Context, l driver.Lease) (int, error) {
	defer rpcCall(ctx)()
	return d.Driver.Release(ctx, l)
}

// An uncontended Lock+Unlock starts no goroutine, even on a driver whose
// requests derive contexts from the ones the Client gives it (a waiting
// Lock's, which ends when the Client closes, and Unlock's, bounded by
// ReleaseTimeout) and whose grants are bound to a session's loss channel:
// the Client's contexts are recognised by the context package as cancellable
// contexts of its own, so a derived context is registered with them rather
// than watched by a goroutine of its own, and the loss watcher of the
// session outlives its last lease for the next grant. Before, each request
// through a gRPC client cost a goroutine start and a wake-up, and so did the
// loss watcher of each Lock holding the only lease of the Client.
func TestDriverCtxNoGoroutine(t *testing.T) {
	if testwait.GoroutinesCreated() == 0 {
		t.Skip("runtime/metrics has no /sched/goroutines-created")
	}
	c := dlock.New(rpcLike{memlock.NewBackend().NewDriver(), make(chan struct{})}, &dlock.Options{TTL: time.Minute})
	defer c.Close()
	m := c.NewMutex("no-goroutine", nil)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
		{"timeout", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cycle := func() {
				ctx, cancel := tc.ctx()
				defer cancel()
				l, err := m.Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			cycle() // the Client's scheduling goroutines are woken once
			const n = 100
			before := testwait.GoroutinesCreated()
			for range n {
				cycle()
			}
			// Allow a stray goroutine of the runtime or the test framework.
			if got := testwait.GoroutinesCreated() - before; got > 5 {
				t.Fatalf("%d Lock+Unlock cycles started %d goroutines, want none", n, got)
			}
		})
	}
}

// The loss watcher kept for a session's next grant still ends a lease
// granted on it when the session ends, and a grant bound to a session that
// has already ended is lost at once.
func TestIdleLossWatcher(t *testing.T) {
	d := rpcLike{memlock.NewBackend().NewDriver(), make(chan struct{})}
	c := dlock.New(d, &dlock.Options{TTL: time.Minute})
	defer c.Close()
	ctx := context.Background()
	m := c.NewMutex("idle-watcher", nil)
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil { // the watcher goes idle
		t.Fatal(err)
	}
	l, err = m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	close(d.lost)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease on the idle watcher's session was not lost when the session ended")
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
	}
	l, err = c.NewMutex("idle-watcher-2", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a grant bound to an ended session was not lost")
	}
}
