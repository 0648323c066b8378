package dlock

import (
	"time"

	"github.com/dlock/dlock/driver"
)

// DriverOf returns the driver c uses, so that tests can reach the fault
// hooks of a driver opened by URL.
func DriverOf(c *Client) driver.Driver { return c.d }

// PendingReleases returns how many releases whose outcome was unknown c is
// still retrying in the background (for tests).
func PendingReleases(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.retries)
}

// BackoffDraws returns the first n waits of a backoff from lo to hi.
func BackoffDraws(lo, hi time.Duration, n int) []time.Duration {
	b := newBackoff(lo, hi)
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = b.next()
	}
	return out
}

// KeepWholeContexts makes leases keep the context Lock was called with
// whole, as when the layout check of valuesOf fails, until restore is called.
func KeepWholeContexts() (restore func()) {
	saved := peelable
	peelable = nil
	return func() { peelable = saved }
}
