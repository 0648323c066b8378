package redisscript

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// argsHook records the arguments and the String of every command a client
// runs, as a tracing hook sees them.
type argsHook struct {
	mu   sync.Mutex
	args [][]any
	strs []string
}

func (h *argsHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *argsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); n != "evalsha" && n != "eval" {
			return err // a new connection's HELLO and CLIENT
		}
		h.mu.Lock()
		h.args = append(h.args, append([]any(nil), cmd.Args()...))
		h.strs = append(h.strs, cmd.String())
		h.mu.Unlock()
		return err
	}
}

func (h *argsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *argsHook) take() ([][]any, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, s := h.args, h.strs
	h.args, h.strs = nil, nil
	return a, s
}

// scripterOnly hides every method of a client but redis.Scripter's, as a
// wrapper that routes its script calls (a lane, a client of one
// connection) looks to evalScript.run: it takes go-redis's own EvalSha and
// Eval, redis.Script.Run's way.
type scripterOnly struct{ redis.Scripter }

// TestEvalScriptCommands: the acquire and release scripts send, through a
// *redis.Client, a *redis.Conn and a Scripter that is neither, the same
// commands as redis.Script.Run (the shape go-redis's EvalSha gives them,
// strings and integers that hooks and cmd.String show as such), and fall
// back to EVAL when the server does not have the script, as Run does.
func TestEvalScriptCommands(t *testing.T) {
	c, ctx := scriptClient(t)
	hook := &argsHook{}
	c.AddHook(hook)
	conn := c.Conn()
	defer conn.Close()
	k := KeysFor(DefaultPrefix, "evalcmds")
	const owner = "owner-1"
	ttl := 10 * time.Second
	// want is what go-redis's Script.Run sends for the same call.
	want := func(name, payload string, keys []string, args ...any) []any {
		a := []any{name, payload, len(keys)}
		for _, key := range keys {
			a = append(a, key)
		}
		return append(a, args...)
	}
	acqKeys := []string{k.Lock, k.Fence, k.Queue, k.Waits}
	relKeys := []string{k.Lock, k.Queue, k.Waits}
	for _, tc := range []struct {
		name string
		c    redis.Scripter
	}{{"client", c}, {"conn", conn}, {"scripter", scripterOnly{c}}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, flush := range []bool{false, true} {
				if flush {
					if err := c.ScriptFlush(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				}
				hook.take()
				if !flush {
					// Load both scripts (the first call on a new
					// server falls back to EVAL) and dial.
					r, err := AcquireQueued(ctx, tc.c, k, owner, ttl, 0, 3*time.Second)
					if err != nil || !r.Granted {
						t.Fatalf("acquire: %+v, %v", r, err)
					}
					if _, held, err := Release(ctx, tc.c, k, owner, r.Fence); err != nil || !held {
						t.Fatalf("release: held %v, %v", held, err)
					}
					hook.take()
				}
				r, err := AcquireQueued(ctx, tc.c, k, owner, ttl, 0, 3*time.Second)
				if err != nil || !r.Granted {
					t.Fatalf("acquire (flushed %v): %+v, %v", flush, r, err)
				}
				if _, held, err := Release(ctx, tc.c, k, owner, r.Fence); err != nil || !held {
					t.Fatalf("release (flushed %v): held %v, %v", flush, held, err)
				}
				args, strs := hook.take()
				acq := []any{int64(10000), int64(0), int64(3000), k.Channel}
				rel := []any{r.Fence, k.Channel}
				exp := [][]any{
					want("evalsha", acquireScript.Hash(), acqKeys, append([]any{owner}, acq...)...),
					want("evalsha", releaseScript.Hash(), relKeys, append([]any{owner}, rel...)...),
				}
				if flush {
					// The flush dropped both scripts: EVALSHA fails
					// (NOSCRIPT), EVAL loads the script, and the next
					// EVALSHA finds it.
					exp = [][]any{
						exp[0],
						want("eval", acquireSrc, acqKeys, append([]any{owner}, acq...)...),
						exp[1],
						want("eval", releaseSrc, relKeys, append([]any{owner}, rel...)...),
					}
				}
				if !reflect.DeepEqual(args, exp) {
					t.Fatalf("flushed %v: commands\n%#v\nwant\n%#v", flush, args, exp)
				}
				for _, s := range strs {
					for _, key := range relKeys {
						if !containsWord(s, key) {
							t.Fatalf("flushed %v: command %q does not show key %q", flush, s, key)
						}
					}
				}
			}
		})
	}
}

func containsWord(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if s[i:i+len(w)] == w && (i+len(w) == len(s) || s[i+len(w)] == ' ') {
			return true
		}
	}
	return false
}

// TestAcquireAllocs bounds the allocations of an uncontended AcquireQueued
// on a *redis.Client and on a *redis.Conn, go-redis's share included: on
// a Conn 10 (the command's one slice; the boxes of the 4 keys, the owner,
// the TTL, the wait and the channel; the Cmd), on a Client the pool's 3
// more.
func TestAcquireAllocs(t *testing.T) {
	c, ctx := scriptClient(t)
	conn := c.Conn()
	defer conn.Close()
	const runs = 200
	for _, tc := range []struct {
		name string
		c    redis.Scripter
		max  float64
	}{{"client", c, 13}, {"conn", conn, 10}} {
		keys := make([]Keys, runs+1) // AllocsPerRun runs f once more
		for i := range keys {
			keys[i] = KeysFor(DefaultPrefix, fmt.Sprintf("allocs-%s-%d", tc.name, i))
		}
		i := 0
		var err error
		n := testing.AllocsPerRun(runs, func() {
			var r AcquireResult
			if r, err = AcquireQueued(ctx, tc.c, keys[i], "owner-0", 10*time.Second, 0, 3*time.Second); err == nil && !r.Granted {
				err = fmt.Errorf("refused: %+v", r)
			}
			i++
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %.1f allocations per AcquireQueued", tc.name, n)
		if n > tc.max {
			t.Errorf("%s: an uncontended AcquireQueued takes %.1f allocations, want at most %v", tc.name, n, tc.max)
		}
	}
}
