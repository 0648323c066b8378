package redisscript

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
)

func scriptClient(t *testing.T) (*redis.Client, context.Context) {
	t.Helper()
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c, ctx
}

// TestAcquireGrantReplyIsOneInteger: a new grant (hold count 1) is
// answered with its token alone, one integer, on the free path and on the
// queue's path; a re-entry with {1, count, token}; and AcquireQueued reads
// both. (Before, every grant was answered with the array.)
func TestAcquireGrantReplyIsOneInteger(t *testing.T) {
	c, ctx := scriptClient(t)
	k := KeysFor(DefaultPrefix, "reply")
	raw := func(owner string, wait int64) any {
		t.Helper()
		v, err := acquireScript.Run(ctx, c, []string{k.Lock, k.Fence, k.queue(), k.waits()}, owner, 60000, 0, wait, k.Channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := raw("a", 0); v != int64(1) {
		t.Fatalf("new grant on the free path: reply %#v, want int64(1) (the token)", v)
	}
	if v, ok := raw("a", 0).([]any); !ok || len(v) != 3 || v[0] != int64(1) || v[1] != int64(2) || v[2] != "1" {
		t.Fatalf("re-entry: reply %#v, want [1 2 \"1\"]", v)
	}
	// b waits (queued); a lets go; b is granted on the queue's path.
	if r, err := AcquireQueued(ctx, c, k, "b", time.Minute, 0, 3*time.Second); err != nil || r.Granted {
		t.Fatalf("b while a holds: %+v, %v; want a refusal", r, err)
	}
	for range 2 {
		if _, held, err := Release(ctx, c, k, "a", 1); err != nil || !held {
			t.Fatalf("release by a: held %v, %v", held, err)
		}
	}
	if n, _ := c.Exists(ctx, k.queue()).Result(); n != 1 {
		t.Fatal("b is not queued")
	}
	if v := raw("b", 3000); v != int64(2) {
		t.Fatalf("new grant to the queue's head: reply %#v, want int64(2)", v)
	}
	if _, _, err := Release(ctx, c, k, "b", 2); err != nil {
		t.Fatal(err)
	}
	for _, want := range []AcquireResult{{Granted: true, Count: 1, Fence: 3}, {Granted: true, Count: 2, Fence: 3}} {
		if r, err := AcquireQueued(ctx, c, k, "c", time.Minute, 0, 3*time.Second); err != nil || r != want {
			t.Fatalf("AcquireQueued = %+v, %v; want %+v", r, err, want)
		}
	}
}

// TestReleaseValues: the release script's outcome for each kind of value
// at the key, the common one (one hold, no lock-delay, compared whole) and
// those it parses, with the token checked or not, and what it publishes.
func TestReleaseValues(t *testing.T) {
	c, ctx := scriptClient(t)
	k := KeysFor(DefaultPrefix, "values")
	ps := c.Subscribe(ctx, k.Channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	msgs := ps.Channel()
	published := func(want string) {
		t.Helper()
		select {
		case m := <-msgs:
			if m.Payload != want {
				t.Fatalf("published %q, want %q", m.Payload, want)
			}
		case <-ctx.Done():
			t.Fatalf("nothing published, want %q", want)
		}
	}
	const owner = "owner-1"
	for _, tc := range []struct {
		name      string
		value     string
		owner     string
		token     uint64
		remaining int
		held      bool
	}{
		{"common value", "1\n7\n\n\nowner-1", owner, 7, 0, true},
		{"common value, token unchecked", "1\n7\n\n\nowner-1", owner, 0, 0, true},
		{"another token", "1\n7\n\n\nowner-1", owner, 8, 0, false},
		{"another owner", "1\n7\n\n\nowner-1", "owner-2", 7, 0, false},
		{"an owner it ends with", "1\n7\n\n\nowner-1", "r-1", 7, 0, false},
		{"re-entered", "2\n7\n\n\nowner-1", owner, 7, 1, true},
		{"live lease with lock-delay", "1\n7\n99999999999999\n500\nowner-1", owner, 7, 0, true},
		{"lease past its expiry, in its lock-delay", "1\n7\n1\n500\nowner-1", owner, 7, 0, false},
		{"foreign value", "someone else's token", owner, 7, 0, false},
	} {
		if err := c.Set(ctx, k.Lock, tc.value, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		remaining, held, err := Release(ctx, c, k, tc.owner, tc.token)
		if err != nil || held != tc.held || remaining != tc.remaining {
			t.Fatalf("%s: Release = %d, %v, %v; want %d, %v", tc.name, remaining, held, err, tc.remaining, tc.held)
		}
		v, err := c.Get(ctx, k.Lock).Result()
		switch {
		case tc.held && tc.remaining == 0:
			if err != redis.Nil {
				t.Fatalf("%s: key left as %q, %v; want it deleted", tc.name, v, err)
			}
			published("7")
		case tc.held:
			if want := strconv.Itoa(tc.remaining) + tc.value[1:]; v != want {
				t.Fatalf("%s: key %q, want %q", tc.name, v, want)
			}
		default:
			if v != tc.value {
				t.Fatalf("%s: key %q changed by a refused release (was %q)", tc.name, v, tc.value)
			}
		}
		_ = c.Del(ctx, k.Lock).Err()
	}
	// A wrong type at the key is not held either.
	if err := c.HSet(ctx, k.Lock, "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if _, held, err := Release(ctx, c, k, owner, 7); err != nil || held {
		t.Fatalf("hash at the key: held %v, %v; want not held", held, err)
	}
}

// TestFastPathsLargeToken: the fast paths of the acquire script (a free
// lock nobody waits for, without lock-delay: the token is concatenated as a
// Lua number below 1e14, formatted with %.0f above) and of the release
// script write and compare the same value as the slow paths, on either side
// of 1e14 where Lua's default number format would turn to an exponent; a
// lock-delay grant (the path after the fast one) reads the counter alike.
func TestFastPathsLargeToken(t *testing.T) {
	c, ctx := scriptClient(t)
	for _, tc := range []struct {
		name  string
		start uint64 // the fencing counter before the grant
		delay time.Duration
	}{
		{"small", 41, 0},
		{"below-1e14", 99999999999998, 0},
		{"at-1e14", 99999999999999, 0},
		{"above-1e14", 123456789012345, 0},
		{"delay-at-1e14", 99999999999999, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := KeysFor(DefaultPrefix, "big-"+tc.name)
			if err := c.Set(ctx, k.Fence, tc.start, 0).Err(); err != nil {
				t.Fatal(err)
			}
			r, err := Acquire(ctx, c, k, "o", time.Minute, tc.delay)
			if err != nil || !r.Granted || r.Fence != tc.start+1 {
				t.Fatalf("acquire: %+v, %v; want a grant with token %d", r, err, tc.start+1)
			}
			v, err := c.Get(ctx, k.Lock).Result()
			if err != nil {
				t.Fatal(err)
			}
			tok := strconv.FormatUint(tc.start+1, 10)
			if want := "1\n" + tok + "\n"; len(v) < len(want) || v[:len(want)] != want {
				t.Fatalf("lock value %q; want it to start with %q", v, want)
			}
			if pttl := c.PTTL(ctx, k.Lock).Val(); pttl <= 59*time.Second || pttl > time.Minute+tc.delay {
				t.Fatalf("PTTL %v; want the TTL (plus the lock-delay %v)", pttl, tc.delay)
			}
			if tc.delay == 0 {
				if want := "1\n" + tok + "\n\n\no"; v != want {
					t.Fatalf("lock value %q; want %q", v, want)
				}
				// The release's fast path compares the value whole.
				if _, held, err := Release(ctx, c, k, "o", tc.start+1); err != nil || !held {
					t.Fatalf("release: held %v, %v", held, err)
				}
				if n := c.Exists(ctx, k.Lock).Val(); n != 0 {
					t.Fatal("the lock key is still there after the release")
				}
			}
		})
	}
}
