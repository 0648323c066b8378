package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock"
)

// quiesceTimeout bounds how long Ctrl-Z waits for the backend calls in
// flight to finish before dlock stops.
const quiesceTimeout = 2 * time.Second

// stopClient is the Client a Ctrl-Z quiesces before dlock stops: nil until
// the backend is open. Safe for concurrent use.
type stopClient struct{ p atomic.Pointer[dlock.Client] }

func (s *stopClient) set(c *dlock.Client) { s.p.Store(c) }

// stop is stopSelf for a dlock with an open Client (or, nil, none): it
// quiesces the Client first, so that the stopped process holds nothing
// that other clients of the backend wait on (a SQLite file's write lock,
// taken by a renewal or a poll in flight, would refuse every other client
// of the file until fg), and lets the Client's calls go on when dlock
// resumes. If the calls in flight do not finish within quiesceTimeout,
// dlock says so and stops anyway: job control must work.
func (s *stopClient) stop(e *env) { s.stopWith(e, stopSelf) }

// stopWith is stop with halt in place of stopSelf (tests pass their own).
func (s *stopClient) stopWith(e *env, halt func()) {
	var c *dlock.Client
	if s != nil {
		c = s.p.Load()
	}
	if c == nil {
		halt()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), quiesceTimeout)
	resume, err := c.Quiesce(ctx)
	cancel()
	if err != nil {
		e.warnf("dlock: stopping with a backend call still running (other clients of the backend may wait until fg): %v", err)
	}
	halt()
	if resume != nil {
		resume()
	}
}
