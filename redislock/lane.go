package redislock

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// laneIdle: a mutex grant or release that comes within laneIdle of the
// previous one may use the driver's lane (see lane); one that comes later
// uses the pool.
const laneIdle = 5 * time.Millisecond

// A lane is one connection of a *redis.Client's pool kept out of the pool
// for the driver's mutex grants and releases while they come back to back
// (each within laneIdle, 5ms, of the one before), one call at a time: a
// call that finds the lane busy uses the pool as before. Taking a
// connection from go-redis's pool checks it first (a MSG_PEEK system call
// per command); the lane's connection is checked when it is taken from the
// pool, and given back as soon as a call comes more than laneIdle after
// the one before (that call, and every later one until calls come back to
// back again, uses the pool). So a connection the server (or a failover)
// closed while idle is found by the pool's check rather than by a failed
// command, as before: only a close within 5ms of a call can fail the next
// call, as it would fail a call in flight; and sparse calls cost what they
// did. A command that fails other than with an error reply from the server
// drops the connection (the next call takes a fresh one). The connection
// is made with the client's hooks of that moment (redis.Client.Conn).
//
// The lane never keeps a connection the application may need: it is used
// only on a pool of at least laneMinPool connections, and a connection
// left idle goes back to the pool after laneGiveBack (a timer), not only at
// the next call.
type lane struct {
	client *redis.Client
	base   time.Time
	last   atomic.Int64 // when the latest call began (lane or pool), ns since base
	idle   *time.Timer  // gives an idle connection back (drop)

	mu     sync.Mutex // held by the call using conn
	conn   *redis.Conn
	closed bool
}

// laneMinPool is the smallest pool a lane takes a connection out of.
const laneMinPool = 4

// laneGiveBack is how long the lane keeps a connection no call uses.
const laneGiveBack = time.Second

// newLane returns c's lane, or nil (no lane: every call uses the pool) when
// c's pool is smaller than laneMinPool.
func newLane(c *redis.Client) *lane {
	if c.Options().PoolSize < laneMinPool {
		return nil
	}
	l := &lane{client: c, base: time.Now()}
	l.idle = time.AfterFunc(time.Hour, l.drop)
	l.idle.Stop()
	return l
}

// drop gives the connection back to the pool when no call has begun for
// laneIdle; it runs on the idle timer, laneGiveBack after the lane's last
// call, and arms it again if calls came since through the pool.
func (l *lane) drop() {
	if !l.mu.TryLock() {
		return // in use: its give arms the timer again
	}
	defer l.mu.Unlock()
	if l.conn == nil {
		return
	}
	if int64(time.Since(l.base))-l.last.Load() <= int64(laneIdle) {
		l.idle.Reset(laneGiveBack)
		return
	}
	_ = l.conn.Close()
	l.conn = nil
}

// take returns the lane's connection, or nil when the call is to use the
// pool: another call is using the lane, the previous call began more than
// laneIdle ago, the lane is closed, or l is nil. A connection returned
// must be given back with give.
func (l *lane) take() *redis.Conn {
	if l == nil {
		return nil
	}
	now := int64(time.Since(l.base))
	prev := l.last.Swap(now)
	if !l.mu.TryLock() {
		return nil
	}
	if l.closed || now-prev > int64(laneIdle) {
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

// give ends the use of the connection take returned; err is the outcome of
// the call's command.
func (l *lane) give(err error) {
	if err != nil && !serverReply(err) {
		_ = l.conn.Close()
		l.conn = nil
	}
	keep := l.conn != nil
	l.mu.Unlock()
	if keep {
		l.idle.Reset(laneGiveBack)
	}
}

// serverReply reports whether err is a reply of the server (an error reply,
// or nil), after which the connection is in step for the next command.
func serverReply(err error) bool {
	var reply redis.Error
	return errors.Is(err, redis.Nil) || errors.As(err, &reply)
}

// close gives the connection back to the pool and keeps the lane from
// taking another; it waits for a call using it.
func (l *lane) close() {
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

// hasConn reports whether the lane keeps a connection now (for tests).
func (l *lane) hasConn() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn != nil
}
