package dlock

import (
	"context"

	"github.com/dlock/dlock/driver"
)

// Quiesce prepares the Client for its process being stopped by job control
// (SIGTSTP, Ctrl-Z, then SIGSTOP): it holds back every new backend call of
// the Client's driver and waits, until ctx ends, for the running ones to
// finish, so that the stopped process holds nothing on the backend that
// other clients wait on (SQLite's file write lock, held by a process
// stopped mid-write, refuses every other client of the file whatever the
// lock name). Call resume once the process runs again (SIGCONT): the
// held-back calls go on. Calling resume more than once does nothing.
//
// While quiesced the Client's leases are not renewed, and Lock, TryLock,
// Unlock and the like block until resume (or their own context's end): a
// process stopped past its leases' TTL loses them to other clients, and
// learns of it through the usual loss signal when it resumes.
//
// If the driver does not implement driver.Quiescer its calls hold nothing
// that outlives them (a network round trip), and Quiesce returns at once
// with a resume that does nothing. If ctx ends before the running calls
// finish, Quiesce lets the held-back calls go and returns an error
// wrapping ctx.Err() with a nil resume; a caller about to stop should stop
// anyway (nothing is worse than before). Quiesce is safe for concurrent
// use; a second Quiesce waits for the first one's resume.
func (c *Client) Quiesce(ctx context.Context) (resume func(), err error) {
	q, ok := c.d.(driver.Quiescer)
	if !ok {
		return func() {}, nil
	}
	return q.Quiesce(ctx)
}
