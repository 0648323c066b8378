package redislock

import (
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// laneIdle is how long the lane's connection may sit unused before the
// next call gives it back to the pool and takes a fresh one (see lane):
// short, so that only back-to-back calls skip the pool's check.
const laneIdle = 5 * time.Millisecond

// A lane is one connection of a *redis.Client's pool kept out of the pool
// for the driver's mutex grants and releases, one call at a time: a call
// that finds the lane busy uses the pool as before. Taking a connection
// from go-redis's pool checks it first (a MSG_PEEK system call per
// command); the lane's connection is checked when it is taken from the
// pool, and given back and taken again once it has been idle for laneIdle
// (5ms), so that a connection the server (or a failover) closed while idle
// is found by the pool's check rather than by a failed command, as before
// (only a close in the 5ms after a call can fail the next call, as it would
// fail a call in flight). A
// command that fails other than with an error reply from the server drops
// the connection (the next call takes a fresh one). The connection is made
// with the client's hooks of that moment (redis.Client.Conn).
type lane struct {
	client *redis.Client
	mu     sync.Mutex // held by the call using conn
	conn   *redis.Conn
	used   time.Time // when conn last answered
	closed bool
}

// take returns the lane's connection, or nil when another call is using it
// (or the lane is closed, or l is nil): the caller then uses the pool. A
// connection returned must be given back with give.
func (l *lane) take() *redis.Conn {
	if l == nil || !l.mu.TryLock() {
		return nil
	}
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	if l.conn != nil && time.Since(l.used) > laneIdle {
		_ = l.conn.Close() // back to the pool, which checks it before its next use
		l.conn = nil
	}
	if l.conn == nil {
		l.conn = l.client.Conn()
	}
	return l.conn
}

// give ends the use of the connection take returned; err is the outcome of
// the call's command.
func (l *lane) give(err error) {
	var reply redis.Error
	if err == nil || errors.Is(err, redis.Nil) || errors.As(err, &reply) {
		l.used = time.Now()
	} else {
		_ = l.conn.Close()
		l.conn = nil
	}
	l.mu.Unlock()
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
