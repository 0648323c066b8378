package redisscript

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
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

// TestHubHonoursContextWhenServerHangs: with the server paused, the hub's
// first SUBSCRIBE cannot finish (go-redis dials it, and holds its pub/sub
// connection's lock meanwhile, for up to its dial timeout). A subscriber
// still returns when its context ends; another subscriber, on another
// channel, does not wait behind it past its own context; and a waiter
// leaving does not wait for either. Once the server resumes, the hub
// works. (Before, each waited for the one before it, and for go-redis's
// dial: the quorum and Redlock waiters of TestRestartEmptyMidHold hung
// for 5-15 s on a paused node with a 500 ms context.)
func TestHubHonoursContextWhenServerHangs(t *testing.T) {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt) // go-redis's own timeouts: dial 5 s, read 3 s
	t.Cleanup(func() { _ = c.Close() })
	h := NewHub(c, nil)
	defer func() { _ = h.Close() }()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = srv.Resume()
		}
	}()

	const aWait, bWait, slack = 2 * time.Second, 300 * time.Millisecond, 700 * time.Millisecond
	type outcome struct {
		err  error
		took time.Duration
	}
	aDone := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), aWait)
		defer cancel()
		start := time.Now()
		_, err := h.SubscribeOwner(ctx, "a", "", make(chan struct{}, 1))
		aDone <- outcome{err, time.Since(start)}
	}()
	testwait.Until(t, aWait/2, "the first subscriber registered", func() bool { return h.Listening("a") })

	j := h.Join("a", "j", make(chan struct{}, 1))
	if j == nil {
		t.Fatal("Join found no waiter on the channel being subscribed")
	}
	start := time.Now()
	j.Close(false)
	if took := time.Since(start); took > slack {
		t.Errorf("a waiter's Close took %v while a SUBSCRIBE was in flight", took)
	}

	ctx, cancel := context.WithTimeout(context.Background(), bWait)
	start = time.Now()
	_, err = h.SubscribeOwner(ctx, "b", "", make(chan struct{}, 1))
	took := time.Since(start)
	cancel()
	if err == nil {
		t.Fatal("a SUBSCRIBE succeeded on a paused server")
	}
	if took > bWait+slack {
		t.Errorf("a subscriber with a %v context returned after %v (%v)", bWait, took, err)
	}
	select {
	case a := <-aDone:
		if a.err == nil {
			t.Error("the first SUBSCRIBE succeeded on a paused server")
		}
		if a.took > aWait+slack {
			t.Errorf("the first subscriber, with a %v context, returned after %v (%v)", aWait, a.took, a.err)
		}
	case <-time.After(aWait + 5*time.Second):
		t.Fatal("the first subscriber never returned")
	}

	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	ctx, cancel = context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	sig := make(chan struct{}, 1)
	s, err := h.SubscribeOwner(ctx, "c", "w", sig)
	if err != nil {
		t.Fatalf("after the server resumed: %v", err)
	}
	defer s.Close(false)
	testwait.Until(t, 10*time.Second, "the channel subscribed after the resume", func() bool {
		m, err := c.PubSubNumSub(ctx, "c").Result()
		return err == nil && m["c"] == 1
	})
	// (That a release then wakes the waiter is TestHubLinger's and the
	// drivers' suites' to check: here a wake-up could not be told from the
	// one the subscription's own confirmation sends.)
}
