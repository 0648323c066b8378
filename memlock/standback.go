package memlock

// Fairness. A release used to wake every subscriber of the name, and a
// goroutine that releases and loops straight back into Lock asks again
// before any woken waiter has been scheduled: with 9 contenders the
// releaser took the lock again 83% of the time, and some waiters waited
// 4.7 s. Three rules now keep the order of arrival:
//
//   - A mutex release wakes the subscriber that subscribed first (the
//     Backend numbers subscriptions); the others only if nobody was
//     granted the lock 10ms later (a paused driver's waiter must not hold
//     the rest up).
//   - A Driver whose release found waiters holds its next new attempts on
//     the name back (internal/standback) until the Backend grants the name
//     again, or 2ms; a TryLock is only delayed, never refused for it, and
//     a waiting Lock the Backend refused before is exempt.
//   - An attempt standing back counts as a waiter until it is made: in a
//     hot loop such attempts are not subscribed yet, and without this the
//     holder's release saw no waiter and it re-took the lock unopposed
//     (77% of hand-offs).
