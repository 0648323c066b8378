package check

import (
	"fmt"
	"sort"
)

func (a *analysis) checkOverlap() {
	for _, name := range a.locks() {
		ls := a.byLock[name]
		for i, x := range ls {
			end := x.believedEnd(a.h.TTL)
			for _, y := range ls[i+1:] {
				if y.grant >= end {
					break
				}
				if y.grant <= x.grant || y.stillborn() {
					continue
				}
				a.add(Violation{Class: ClassValidityOverlap, Lock: name, From: x.grant, At: y.grant,
					Ops: []OpRef{x.ref, y.ref},
					Evidence: fmt.Sprintf("lock %q: %s (token %d, granted %s) believed its lease valid until %s; %s was granted token %d at %s, %s before%s",
						name, x.ref, x.ref.Token, a.secs(x.grant), a.secs(end), y.ref, y.ref.Token, a.secs(y.grant), dur(end-y.grant), a.validRead(y))})
			}
		}
	}
}

// validRead describes the validity y read with its grant, for evidence.
func (a *analysis) validRead(y *lease) string {
	if y.grantValid == 0 {
		return ""
	}
	return fmt.Sprintf(" (and read its own lease valid for %s)", dur(y.grantValid-y.grant))
}

func (a *analysis) checkWrites() {
	// a key's attempts (a replacement worker may reuse a key): a write
	// belongs to the latest one granted before it
	byKey := map[opKey][]*lease{}
	for _, l := range a.leases {
		if l.granted() {
			k := opKey{l.ref.Worker, l.ref.Goroutine, l.ref.Op}
			byKey[k] = append(byKey[k], l)
		}
	}
	for _, e := range a.events {
		if e.Kind != KindWrite {
			continue
		}
		var w *lease
		for _, l := range byKey[opKey{e.Worker, e.Goroutine, e.Op}] {
			if l.grant <= e.Mono {
				w = l
			}
		}
		if w == nil {
			continue
		}
		vu := e.ValidUntil
		if vu == 0 {
			vu = w.validUntil
		}
		tw := e.Mono
		if vu <= tw || (w.done != none && w.done <= tw) || (w.unlockStart != none && w.unlockStart <= tw) || (w.died != none && w.died <= tw) {
			continue
		}
		ls := a.byLock[w.lock]
		var other *lease
		for i := sort.Search(len(ls), func(i int) bool { return ls[i].grant >= tw }) - 1; i >= 0 && ls[i].grant > w.grant; i-- {
			if ls[i] != w && ls[i].ref.Token > w.ref.Token {
				other = ls[i]
				break
			}
		}
		if other == nil {
			continue
		}
		fate := "the fence accepted it"
		if !e.Accepted {
			fate = "the fence rejected it"
		}
		a.add(Violation{Class: ClassUnsafeWrite, Lock: w.lock, From: w.grant, At: tw,
			Ops: []OpRef{w.ref, other.ref},
			Evidence: fmt.Sprintf("lock %q: %s wrote with token %d at %s, its lease valid until %s; %s had been granted token %d at %s; %s",
				w.lock, w.ref, e.Token, a.secs(tw), a.secs(vu), other.ref, other.ref.Token, a.secs(other.grant), fate)})
	}
}

func (a *analysis) checkTokens() {
	for _, name := range a.locks() {
		ls := a.byLock[name]
		// prefix maximum of tokens by grant time
		best := make([]*lease, len(ls))
		for i, l := range ls {
			best[i] = l
			if i > 0 && best[i-1].ref.Token >= l.ref.Token {
				best[i] = best[i-1]
			}
		}
		for _, y := range ls {
			if y.request == none {
				continue
			}
			i := sort.Search(len(ls), func(i int) bool { return ls[i].grant >= y.request }) - 1
			if i < 0 {
				continue
			}
			x := best[i]
			if x != y && y.ref.Token <= x.ref.Token {
				a.add(Violation{Class: ClassTokenOrder, Lock: name, From: x.grant, At: y.grant,
					Ops: []OpRef{x.ref, y.ref},
					Evidence: fmt.Sprintf("lock %q: %s was granted token %d at %s; %s requested at %s and was granted token %d at %s, not greater",
						name, x.ref, x.ref.Token, a.secs(x.grant), y.ref, a.secs(y.request), y.ref.Token, a.secs(y.grant))})
			}
		}
		first := map[uint64]*lease{}
		for _, l := range ls {
			x, ok := first[l.ref.Token]
			if !ok {
				first[l.ref.Token] = l
				continue
			}
			a.add(Violation{Class: ClassDuplicateToken, Lock: name, From: x.grant, At: l.grant,
				Ops: []OpRef{x.ref, l.ref},
				Evidence: fmt.Sprintf("lock %q: token %d granted twice: to %s at %s and to %s at %s",
					name, l.ref.Token, x.ref, a.secs(x.grant), l.ref, a.secs(l.grant))})
		}
	}
}

func (a *analysis) checkLateUnlock() {
	for _, name := range a.locks() {
		ls := a.byLock[name]
		for i, x := range ls {
			if x.unlockEnd == none || x.unlockErr != "" || x.unlockStart == none {
				continue
			}
			for _, y := range ls[i+1:] {
				if y.grant >= x.unlockStart {
					break
				}
				if y.grant <= x.grant || y.stillborn() {
					continue
				}
				if y.ref.Token != 0 && x.ref.Token != 0 && y.ref.Token < x.ref.Token {
					// Observed after x's grant, but the server made it
					// before (tokens grow with every grant): only its reply
					// was slower, and x's is the newer lease, which x may
					// release. (Grants out of token order are token-order's
					// business.)
					continue
				}
				a.add(Violation{Class: ClassLateUnlock, Lock: name, From: y.grant, At: x.unlockEnd,
					Ops: []OpRef{x.ref, y.ref},
					Evidence: fmt.Sprintf("lock %q: %s (token %d) started Unlock at %s and it returned nil at %s, but %s had been granted token %d at %s",
						name, x.ref, x.ref.Token, a.secs(x.unlockStart), a.secs(x.unlockEnd), y.ref, y.ref.Token, a.secs(y.grant))})
				break
			}
		}
	}
}

// countOverlaps counts pairs of critical sections of one lock that overlap
// in time, each from its grant to the holder's last write: the collisions an
// unfenced resource would have seen (a holder paused past its lease that
// writes when it resumes collides with every holder granted meanwhile). A
// holder that wrote nothing has no section.
func (a *analysis) countOverlaps() {
	for _, name := range a.locks() {
		ls := a.byLock[name]
		for i, x := range ls {
			xe := x.sectionEnd()
			if xe == none {
				continue
			}
			for _, y := range ls[i+1:] {
				if y.grant >= xe {
					break
				}
				if y.sectionEnd() != none {
					a.rep.UnfencedOverlaps++
				}
			}
		}
	}
}
