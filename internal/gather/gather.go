// Package gather collects the answers of calls fanned out to several
// nodes when a quorum of them is enough.
package gather

import "time"

// Quorum receives up to n values from results and returns them in the
// order they came. Once want of them satisfy ok, the others get as long
// again as that took from the call (at least 2 ms): a node that is up
// answers within it, one that has stopped answering costs the caller
// nothing more. The values it did not receive stay in results (a caller
// whose senders may block must drain them). It does not stop otherwise:
// each sender must be bounded (a node timeout).
func Quorum[T any](results <-chan T, n, want int, ok func(T) bool) []T {
	start := time.Now()
	got := make([]T, 0, n)
	good := 0
	var grace <-chan time.Time
	for len(got) < n {
		select {
		case v := <-results:
			got = append(got, v)
			if ok(v) {
				good++
			}
			if good >= want && grace == nil && len(got) < n {
				t := time.NewTimer(max(time.Since(start), 2*time.Millisecond))
				defer t.Stop()
				grace = t.C
			}
		case <-grace:
			return got
		}
	}
	return got
}
