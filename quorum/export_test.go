package quorum

import "github.com/dlock/dlock/driver"

// HeldBy reports how many nodes hold g, a grant of a quorum Driver, late
// grants (answers after the acquire returned) included.
func HeldBy(g driver.Grant) int {
	h := g.Handle.(*handle)
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.nodes {
		if p.held {
			n++
		}
	}
	return n
}
