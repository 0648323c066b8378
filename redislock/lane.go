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
type lane struct {
	client *redis.Client
	base   time.Time
	last   atomic.Int64 // when the latest call began (lane or pool), ns since base

	mu     sync.Mutex // held by the call using conn
	conn   *redis.Conn
	closed bool
}

func newLane(c *redis.Client) *lane { return &lane{client: c, base: time.Now()} }

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
	l.mu.Unlock()
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.conn != nil {
		_ = l.conn.Close()
		l.conn = nil
	}
}
