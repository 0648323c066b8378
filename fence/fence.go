// Package fence is the resource side of fencing tokens. A lock alone cannot
// stop a holder that paused (GC, SIGSTOP, a slow network) past its lease from
// writing after a new holder took over; the resource can, if every write
// carries the writer's token and the resource refuses tokens below the
// highest it has accepted (Kleppmann's fencing, Chubby's sequencers).
//
// Checker does that in memory for a resource server written in Go. When the
// resource is a database row, do the same check in the write itself, so the
// check and the write are one atomic step:
//
//	-- PostgreSQL / SQLite / MySQL: the row keeps the highest token it accepted
//	UPDATE accounts SET balance = $1, fence = $2
//	 WHERE id = $3 AND fence <= $2;
//	-- 0 rows affected: a newer holder has written; the caller lost its lock.
//
// and in Redis, with a script that compares before it writes:
//
//	-- KEYS[1] = resource, KEYS[2] = resource's fence, ARGV[1] = token, ARGV[2] = value
//	local f = tonumber(redis.call('GET', KEYS[2]) or '0')
//	if tonumber(ARGV[1]) < f then return 0 end
//	redis.call('SET', KEYS[2], ARGV[1])
//	redis.call('SET', KEYS[1], ARGV[2])
//	return 1
//
// Equal tokens are accepted so that one holder may write many times.
package fence

import (
	"errors"
	"fmt"
	"sync"
)

// ErrStale is returned when a token is below the highest already accepted
// for the resource: its holder has lost the lock to a newer one.
var ErrStale = errors.New("fence: stale fencing token")

// StaleError reports a refused token and the highest accepted one. It wraps
// ErrStale.
type StaleError struct {
	Resource string
	Token    uint64 // the refused token
	Highest  uint64 // the highest token accepted so far
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: stale fencing token %d for %q (highest accepted %d)", e.Token, e.Resource, e.Highest)
}

// Unwrap returns ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// Checker remembers, per resource, the highest fencing token it accepted.
// The zero value is ready to use. A Checker is safe for concurrent use.
// It keeps one entry per resource name it has seen, for its lifetime.
type Checker struct {
	mu      sync.Mutex
	highest map[string]uint64
}

// Check accepts token for resource if it is not below the highest token
// accepted for that resource so far, and records it. It returns a
// *StaleError (wrapping ErrStale) otherwise. Token 0 is never valid.
func (c *Checker) Check(resource string, token uint64) error {
	return c.Do(resource, token, func() error { return nil })
}

// Do runs write only if token is accepted for resource, holding the
// Checker's lock while write runs, so that a newer token cannot be accepted
// (and its write begun) until this write has finished. Writes through one
// Checker are therefore serialised across all resources; use one Checker per
// resource where that matters. write's error is returned as is; a refused
// token returns a *StaleError without calling write.
func (c *Checker) Do(resource string, token uint64, write func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.highest == nil {
		c.highest = map[string]uint64{}
	}
	h := c.highest[resource]
	if token == 0 || token < h {
		return &StaleError{Resource: resource, Token: token, Highest: h}
	}
	c.highest[resource] = token
	return write()
}

// Highest returns the highest token accepted for resource, 0 if none.
func (c *Checker) Highest(resource string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.highest[resource]
}
