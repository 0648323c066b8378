package redlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testserver"
)

// TestUncontendedReleaseCommands bounds the commands the release of an
// uncontended lock (one hold, no lock-delay, no queue, no qg hash) runs on
// a node: GET, EXISTS, DEL and PUBLISH, with the token given (0, as
// Release passes it, and the grant's own). Each redis.call costs every node
// CPU in every Unlock. Before: 5 (an HDEL of the owner's qg field and an
// EXISTS of the queue where one EXISTS of both keys tells that neither
// exists). It also checks what the release does: the lock is gone and its
// token is published on the release channel; and that an owner granted
// the lock by a release that took the last waiter out of the queue (its
// qg record "=token" then outlives the queue) still has that record
// dropped by its release.
func TestUncontendedReleaseCommands(t *testing.T) {
	c := scriptClient(t)
	ctx := ctxT(t, 20*time.Second)
	cs := []*redis.Client{c}
	k := redisscript.KeysFor(DefaultKeyPrefix, "uncontended-release")
	sub := c.Subscribe(ctx, k.Channel, "grant-ch-uncontended")
	t.Cleanup(func() { _ = sub.Close() })
	for range 2 {
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, byToken := range []bool{false, true} {
		r, err := redisscript.Acquire(ctx, c, k, "o", 10*time.Second, 0)
		if err != nil || !r.Granted {
			t.Fatalf("acquire: %+v, %v", r, err)
		}
		var tok uint64
		if byToken {
			tok = r.Fence
		}
		resetServerStats(t, cs)
		if rem, held, err := releaseGranting(ctx, c, k, "o", tok); err != nil || !held || rem != 0 {
			t.Fatalf("release (token %d): %d left, held %v, %v", tok, rem, held, err)
		}
		var cmds int64
		var ran []string
		for cmd, x := range readServerStats(t, cs).byCmd {
			if cmd == "evalsha" || cmd == "eval" || cmd == "info" || strings.HasPrefix(cmd, "config") {
				continue
			}
			cmds += x[0]
			ran = append(ran, cmd+"×"+strconv.FormatInt(x[0], 10))
		}
		t.Logf("release with token %d ran %d commands: %v", tok, cmds, ran)
		if cmds > maxUncontendedReleaseCommands {
			t.Fatalf("an uncontended release (token %d) ran %d commands %v; want at most %d", tok, cmds, ran, maxUncontendedReleaseCommands)
		}
		expectReleased(t, ctx, c, sub, k, r.Fence)
	}

	// w is granted the lock by h's release, which takes w, the only
	// waiter, out of the queue: w's record "=token" stays in qg, and w,
	// holding on grant messages, never adopts it; w's release drops it.
	qg := grantsKey(k)
	score := time.Now().UnixMilli()
	for i, o := range []string{"h", "w"} {
		r, _, err := acquireWaiting(ctx, c, k, o, 10*time.Second, 0, score+int64(i), "grant-ch-uncontended")
		if err != nil || r.Granted != (o == "h") {
			t.Fatalf("%s's attempt: %+v, %v", o, r, err)
		}
	}
	if _, held, err := releaseGranting(ctx, c, k, "h", 0); err != nil || !held {
		t.Fatalf("h's release: held %v, %v", held, err)
	}
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Channel != "grant-ch-uncontended" {
		t.Fatalf("h's release published %q on %s; want w's grant", m.Payload, m.Channel)
	}
	wTok, err := strconv.ParseUint(strings.SplitN(m.Payload, "\n", 2)[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, k.Queue).Result(); err != nil || n != 0 {
		t.Fatalf("queue exists (%d, %v) after its only waiter was granted", n, err)
	}
	if rec, err := c.HGet(ctx, qg, "w").Result(); err != nil || rec != "="+strconv.FormatUint(wTok, 10) {
		t.Fatalf("w's qg record %q, %v after its grant; want =%d", rec, err, wTok)
	}
	if _, held, err := releaseGranting(ctx, c, k, "w", 0); err != nil || !held {
		t.Fatalf("w's release: held %v, %v", held, err)
	}
	expectReleased(t, ctx, c, sub, k, wTok)
	if ok, err := c.HExists(ctx, qg, "w").Result(); err != nil || ok {
		t.Fatalf("w's qg record still there (%v, %v) after w released its grant", ok, err)
	}
}

// maxUncontendedReleaseCommands bounds TestUncontendedReleaseCommands:
// GET, EXISTS (queue and qg), DEL, PUBLISH (5 before, with the HDEL of
// the owner's qg field).
const maxUncontendedReleaseCommands = 4

// TestGrantReleaseParsedValue: a release of a value the fast path does
// not take (a lock-delay's expiry in it) still drops the owner's qg
// record when the queue is gone, and still wakes the queue's first waiter
// (one without a grant request) when qg is gone: the one EXISTS of both
// keys decides both steps.
func TestGrantReleaseParsedValue(t *testing.T) {
	c := scriptClient(t)
	ctx := ctxT(t, 20*time.Second)
	k := redisscript.KeysFor(DefaultKeyPrefix, "parsed-release")
	qg := grantsKey(k)
	sub := c.Subscribe(ctx, k.Channel)
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	delayed := func(owner string, token int) string {
		exp := time.Now().Add(10 * time.Second).UnixMilli()
		return "1\n" + strconv.Itoa(token) + "\n" + strconv.FormatInt(exp, 10) + "\n100\n" + owner
	}
	// qg without a queue: w's record goes with w's release.
	if err := c.Set(ctx, k.Lock, delayed("w", 9), 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, qg, "w", "=9").Err(); err != nil {
		t.Fatal(err)
	}
	if _, held, err := releaseGranting(ctx, c, k, "w", 0); err != nil || !held {
		t.Fatalf("w's release: held %v, %v", held, err)
	}
	expectReleased(t, ctx, c, sub, k, "9")
	if n, err := c.Exists(ctx, qg).Result(); err != nil || n != 0 {
		t.Fatalf("qg exists (%d, %v) after w released its grant", n, err)
	}

	// A queue without qg: its first waiter is woken.
	if err := c.Set(ctx, k.Lock, delayed("h", 11), 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := redisscript.AcquireAtScore(ctx, c, k, "x", 10*time.Second, 0, 10*time.Second, time.Now().UnixMilli()); err != nil || r.Granted {
		t.Fatalf("x's attempt: %+v, %v", r, err)
	}
	if _, held, err := releaseGranting(ctx, c, k, "h", 11); err != nil || !held {
		t.Fatalf("h's release: held %v, %v", held, err)
	}
	expectReleased(t, ctx, c, sub, k, "11\nx")
}

// scriptClient starts a Redis server of the test's own and returns a
// client of it, closed when the test ends: for tests that run the scripts
// directly and read the server's commandstats.
func scriptClient(t *testing.T) *redis.Client {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// expectReleased checks that k's lock is free and that its release
// published payload on k's release channel (the next message sub has).
func expectReleased(t *testing.T, ctx context.Context, c *redis.Client, sub *redis.PubSub, k redisscript.Keys, payload any) {
	t.Helper()
	if n, err := c.Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		t.Fatalf("lock exists (%d, %v) after its release", n, err)
	}
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(payload); m.Channel != k.Channel || m.Payload != want {
		t.Fatalf("release published %q on %s; want %q on %s", m.Payload, m.Channel, want, k.Channel)
	}
}
