package redisscript

import (
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testwait"
)

// TestHubLinger: with SetLinger, a channel stays subscribed after its last
// waiter left; Join registers a waiter on it without a command, and a
// release published after Join wakes it; the channel is unsubscribed once
// it has had no waiter for the linger. Without a linger, the last waiter's
// Close unsubscribes at once and Join finds nothing to join.
func TestHubLinger(t *testing.T) {
	c, ctx := scriptClient(t)
	numsub := func(ch string) int64 {
		t.Helper()
		m, err := c.PubSubNumSub(ctx, ch).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m[ch]
	}
	for _, linger := range []time.Duration{0, 300 * time.Millisecond} {
		h := NewHub(c, nil)
		h.SetLinger(linger)
		ch := "linger-" + linger.String()
		sig := make(chan struct{}, 1)
		s, err := h.SubscribeOwner(ctx, ch, "a", sig)
		if err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, 5*time.Second, "the channel subscribed", func() bool { return numsub(ch) == 1 })
		s.Close(false)
		if linger == 0 {
			testwait.Until(t, 5*time.Second, "the channel unsubscribed at once", func() bool { return numsub(ch) == 0 })
			if h.Listening(ch) || h.Join(ch, "b", sig) != nil {
				t.Error("without a linger, a channel with no waiter can still be joined")
			}
			_ = h.Close()
			continue
		}
		left := time.Now()
		if !h.Listening(ch) {
			t.Fatal("the hub stopped listening as its last waiter left, despite the linger")
		}
		sig2 := make(chan struct{}, 1)
		j := h.Join(ch, "b", sig2)
		if j == nil {
			t.Fatal("Join found no lingering channel")
		}
		if err := c.Publish(ctx, ch, "7\nb").Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sig2:
		case <-ctx.Done():
			t.Fatal("a release naming the joined waiter did not wake it")
		}
		if n := numsub(ch); n != 1 {
			t.Fatalf("%d subscribers while the joined waiter waits, want 1", n)
		}
		j.Close(false)
		testwait.Until(t, 5*time.Second, "the channel unsubscribed after the linger", func() bool { return numsub(ch) == 0 })
		if d := time.Since(left); d < linger {
			t.Errorf("unsubscribed %v after the last waiter left, before the linger of %v", d, linger)
		}
		if h.Listening(ch) || h.Join(ch, "c", sig) != nil {
			t.Error("the hub still offers a channel it unsubscribed")
		}
		_ = h.Close()
	}
}
