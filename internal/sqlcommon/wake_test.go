package sqlcommon

import (
	"context"
	"testing"
	"time"
)

// chanWaiter's Wait returns the outcomes sent on its channel, one per call.
type chanWaiter struct {
	out    chan Outcome
	closed chan struct{}
}

func (w *chanWaiter) Wait(ctx context.Context) (Outcome, error) {
	select {
	case o := <-w.out:
		return o, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (w *chanWaiter) Close() { close(w.closed) }

// TestWatchesWakeLongestWaiter: one Waiter serves every subscriber of a
// name; a Released outcome wakes the longest-waiting subscriber only, a
// closing subscriber's unconsumed wake passes to the next, a StillHeld
// outcome wakes nobody, and Close ends the watch and closes its Waiter.
func TestWatchesWakeLongestWaiter(t *testing.T) {
	ctx := context.Background()
	w := &chanWaiter{out: make(chan Outcome), closed: make(chan struct{})}
	opened := 0
	ws := NewWatches(func(context.Context, string) (Waiter, error) {
		opened++
		return w, nil
	}, nil)
	var subs []interface {
		C() <-chan struct{}
		Close() error
	}
	for i := 0; i < 3; i++ {
		s, err := ws.Subscribe(ctx, "n")
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, s)
	}
	if opened != 1 {
		t.Fatalf("%d Waiters opened for one name, want 1", opened)
	}
	woken := func(i int) {
		t.Helper()
		select {
		case <-subs[i].C():
		case <-time.After(10 * time.Second):
			t.Fatalf("subscriber %d not woken within 10s", i)
		}
	}
	quiet := func() {
		t.Helper()
		for i, s := range subs {
			select {
			case <-s.C():
				t.Fatalf("subscriber %d woken unexpectedly", i)
			default:
			}
		}
	}
	w.out <- StillHeld
	w.out <- Released // sent only once the StillHeld round is done
	woken(0)
	quiet()
	w.out <- Released
	// Subscriber 0 does not consume this wake: closing passes it on.
	w.out <- StillHeld // the wake is delivered before this round starts
	_ = subs[0].Close()
	woken(1)
	quiet()
	ws.Close(true)
	select {
	case <-w.closed:
	default:
		t.Fatal("Close(true) returned with the Waiter still open")
	}
	if _, err := ws.Subscribe(ctx, "n"); err == nil {
		t.Fatal("Subscribe after Close succeeded")
	}
	for _, s := range subs {
		_ = s.Close()
	}
}
