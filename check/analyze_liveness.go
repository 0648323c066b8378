package check

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
)

// interval is a half-open stretch [from, to) on the Mono clock.
type interval struct{ from, to int64 }

// subtract removes the union of cut from iv and returns what is left, in
// order.
func subtract(iv interval, cut []interval) []interval {
	out := []interval{iv}
	for _, c := range cut {
		var next []interval
		for _, p := range out {
			if c.to <= p.from || c.from >= p.to {
				next = append(next, p)
				continue
			}
			if c.from > p.from {
				next = append(next, interval{p.from, c.from})
			}
			if c.to < p.to {
				next = append(next, interval{c.to, p.to})
			}
		}
		out = next
	}
	return out
}

// faultCover is every fault window extended by FaultRecovery.
func (a *analysis) faultCover() []interval {
	rec := int64(FaultRecovery(a.h))
	var cut []interval
	for _, w := range a.windows {
		cut = append(cut, interval{w.start, w.end + rec})
	}
	return cut
}

func (a *analysis) checkLiveness() {
	bound := int64(LivenessBound(a.h))
	if bound <= 0 {
		return
	}
	cut := a.faultCover()
	stop := a.livenessEnd()
	type edge struct {
		t            int64
		dWait, dHeld int
	}
	perLock := map[string][]edge{}
	for _, l := range a.leases {
		if l.lock == "" {
			continue
		}
		if l.request != none {
			end := a.end
			for _, t := range []int64{l.grant, l.acquireErr, l.died} {
				if t != none && t < end {
					end = t
				}
			}
			if end > l.request {
				perLock[l.lock] = append(perLock[l.lock], edge{l.request, 1, 0}, edge{end, -1, 0})
			}
		}
		if l.granted() {
			perLock[l.lock] = append(perLock[l.lock], edge{l.grant, 0, 1}, edge{l.heldEnd(a.end), 0, -1})
		}
	}
	names := make([]string, 0, len(perLock))
	for n := range perLock {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		es := perLock[name]
		// edges at one instant are applied together, so a hand-over at
		// the instant of a release is seamless
		slices.SortStableFunc(es, func(x, y edge) int { return cmp.Compare(x.t, y.t) })
		wait, held := 0, 0
		stretchFrom := int64(none)
		flush := func(to int64) {
			if stretchFrom == none {
				return
			}
			for _, p := range subtract(interval{stretchFrom, min(to, stop)}, cut) {
				if p.to-p.from > bound {
					a.add(Violation{Class: ClassLiveness, Lock: name, From: p.from, At: p.to,
						Evidence: fmt.Sprintf("lock %q: waiters and no holder from %s to %s (%s, bound %s = 2×TTL + lock-delay), outside fault windows",
							name, a.secs(p.from), a.secs(p.to), dur(p.to-p.from), dur(bound))})
				}
			}
			stretchFrom = none
		}
		for i := 0; i < len(es); {
			t := es[i].t
			for ; i < len(es) && es[i].t == t; i++ {
				wait += es[i].dWait
				held += es[i].dHeld
			}
			starving := wait > 0 && held <= 0
			if starving && stretchFrom == none {
				stretchFrom = t
			} else if !starving {
				flush(t)
			}
		}
		flush(a.end)
	}
}

// livenessEnd is when liveness stops being judged: the history's Stop when
// it has one, else its end.
func (a *analysis) livenessEnd() int64 {
	if s := a.h.Stop; s > a.start && s < a.end {
		return s
	}
	return a.end
}
