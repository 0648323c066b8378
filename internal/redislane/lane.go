// Package redislane keeps one connection of a go-redis pool out of the pool
// for a driver's back-to-back script calls (a lane), so that they skip the
// pool's per-command connection check. The redislock driver runs its mutex
// grants and releases on a lane; the redlock driver runs every script call
// to a node on that node's lane (see Client).
package redislane

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Idle: a call that comes within Idle of the previous one may use the lane;
// one that comes later uses the pool.
const Idle = 5 * time.Millisecond

// MinPool is the smallest pool a lane takes a connection out of.
const MinPool = 4

// GiveBack is how long a lane keeps a connection no call uses.
const GiveBack = time.Second

// A Lane is one connection of a *redis.Client's pool kept out of the pool
// for calls that come back to back (each within Idle, 5ms, of the one
// before), one call at a time: a call that finds the lane busy uses the
// pool as before. Taking a connection from go-redis's pool checks it first
// (a MSG_PEEK system call per command); the lane's connection is checked
// when it is taken from the pool, and given back as soon as a call comes
// more than Idle after the one before (that call, and every later one until
// calls come back to back again, uses the pool). So a connection the server
// (or a failover) closed while idle is found by the pool's check rather
// than by a failed command, as before: only a close within 5ms of a call
// can fail the next call, as it would fail a call in flight; and sparse
// calls cost what they did. A command that fails other than with an error
// reply from the server drops the connection (the next call takes a fresh
// one). The connection is made with the client's hooks of that moment
// (redis.Client.Conn).
//
// A lane never keeps a connection the application may need: there is one
// only on a pool of at least MinPool connections, and a connection left
// idle goes back to the pool after GiveBack (a timer), not only at the next
// call. A nil *Lane is valid: every call uses the pool.
type Lane struct {
	client *redis.Client
	base   time.Time
	last   atomic.Int64 // when the latest call began (lane or pool), ns since base
	within int64        // Idle in ns; tests widen it (SetIdle)
	idle   *time.Timer  // gives an idle connection back (drop)

	mu     sync.Mutex // held by the call using conn
	conn   *redis.Conn
	closed bool
}

// New returns c's lane, or nil (no lane: every call uses the pool) when c's
// pool is smaller than MinPool.
func New(c *redis.Client) *Lane {
	if c.Options().PoolSize < MinPool {
		return nil
	}
	l := &Lane{client: c, base: time.Now(), within: int64(Idle)}
	l.idle = time.AfterFunc(time.Hour, l.drop)
	l.idle.Stop()
	return l
}

// drop gives the connection back to the pool when no call has begun for
// Idle; it runs on the idle timer, GiveBack after the lane's last call, and
// arms it again if calls came since through the pool.
func (l *Lane) drop() {
	if !l.mu.TryLock() {
		return // in use: its Give arms the timer again
	}
	defer l.mu.Unlock()
	if l.conn == nil {
		return
	}
	if int64(time.Since(l.base))-l.last.Load() <= l.within {
		l.idle.Reset(GiveBack)
		return
	}
	_ = l.conn.Close()
	l.conn = nil
}

// Take returns the lane's connection, or nil when the call is to use the
// pool: another call is using the lane, the previous call began more than
// Idle ago, the lane is closed, or l is nil. A connection returned must be
// given back with Give.
func (l *Lane) Take() *redis.Conn {
	if l == nil {
		return nil
	}
	now := int64(time.Since(l.base))
	prev := l.last.Swap(now)
	if !l.mu.TryLock() {
		return nil
	}
	if l.closed || now-prev > l.within {
		if l.conn != nil {
			_ = l.conn.Close() // back to the pool, which checks it before its next use
			l.conn = nil
		}
		l.mu.Unlock()
		return nil
	}
	if l.conn == nil {
		l.conn = l.client.Conn()
	}
	return l.conn
}

// Give ends the use of the connection Take returned; err is the outcome of
// the call's command.
func (l *Lane) Give(err error) {
	if err != nil && !serverReply(err) {
		_ = l.conn.Close()
		l.conn = nil
	}
	keep := l.conn != nil
	l.mu.Unlock()
	if keep {
		l.idle.Reset(GiveBack)
	}
}

// serverReply reports whether err is a reply of the server (an error reply,
// or nil), after which the connection is in step for the next command.
func serverReply(err error) bool {
	var reply redis.Error
	return errors.Is(err, redis.Nil) || errors.As(err, &reply)
}

// Close gives the connection back to the pool and keeps the lane from
// taking another; it waits for a call using it. A nil l is left alone.
func (l *Lane) Close() {
	if l == nil {
		return
	}
	l.idle.Stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.conn != nil {
		_ = l.conn.Close()
		l.conn = nil
	}
}

// HasConn reports whether the lane keeps a connection now (for tests).
func (l *Lane) HasConn() bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil
}

// SetLastCall records that the latest call began ago before now (for
// tests): with ago 0 the next call is back to back and uses the lane, with
// ago above Idle it uses the pool.
func (l *Lane) SetLastCall(ago time.Duration) {
	l.last.Store(int64(time.Since(l.base) - ago))
}

// SetIdle replaces Idle for l (for tests, before its first call): on a
// loaded machine a round trip can take longer than 5ms, and a test of what
// back-to-back calls do must not depend on that.
func (l *Lane) SetIdle(d time.Duration) { l.within = int64(d) }

// Client is a redis.UniversalClient whose EvalSha and Eval calls (those of
// redis.Script.Run) run on a lane when the lane takes them; every other
// call goes to the client it wraps.
type Client struct {
	redis.UniversalClient
	lane *Lane
}

// Wrap returns c with its script calls on a new lane (see New), and that
// lane, which the caller closes (Lane.Close) before it closes c. A client
// other than a *redis.Client, or one whose pool is smaller than MinPool, is
// returned as it is, with a nil lane.
func Wrap(c redis.UniversalClient) (redis.UniversalClient, *Lane) {
	rc, ok := c.(*redis.Client)
	if !ok {
		return c, nil
	}
	l := New(rc)
	if l == nil {
		return c, nil
	}
	return &Client{UniversalClient: c, lane: l}, l
}

// Unwrap returns the client c wraps.
func (c *Client) Unwrap() redis.UniversalClient { return c.UniversalClient }

// EvalSha runs EVALSHA on the lane, or through the pool when the lane does
// not take the call.
func (c *Client) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if conn := c.lane.Take(); conn != nil {
		return c.give(conn.EvalSha(ctx, sha1, keys, args...))
	}
	return c.UniversalClient.EvalSha(ctx, sha1, keys, args...)
}

// Eval runs EVAL on the lane, or through the pool when the lane does not
// take the call.
func (c *Client) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if conn := c.lane.Take(); conn != nil {
		return c.give(conn.Eval(ctx, script, keys, args...))
	}
	return c.UniversalClient.Eval(ctx, script, keys, args...)
}

// give ends a lane call whose command is cmd.
func (c *Client) give(cmd *redis.Cmd) *redis.Cmd {
	c.lane.Give(cmd.Err())
	return cmd
}
