package memlock

// Stand-back after a contended release (see internal/standback). A release
// wakes every subscriber of the name, and a goroutine that releases and
// loops straight back into Lock asks again before any woken waiter has been
// scheduled: with 9 contenders the releaser took the lock again 83% of the
// time, and some waiters waited 4.7 s. So a Driver whose release of a mutex
// found subscribers holds its next new attempts on that name back for up
// to 2ms or until the Backend grants the name again, whichever comes first
// (a TryLock is only delayed, never refused for it); a waiting Lock the
// Backend refused before is exempt. Ending at the next grant matters here:
// a standing-back goroutine is not yet subscribed, so a whole 2ms would
// leave the woken waiter to re-take the lock unopposed hundreds of times.
