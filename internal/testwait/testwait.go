// Package testwait is the one poll-with-a-deadline loop of dlock's tests: a
// test waits on the condition it cares about, never on a fixed sleep.
package testwait

import (
	"testing"
	"time"
)

// Interval is how often Until polls. Inside a testing/synctest bubble the
// polls run on the bubble's fake clock.
const Interval = 5 * time.Millisecond

// Until polls cond every Interval until it holds, and fails t (naming what)
// if it does not within within.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(Interval)
	}
}
