package check

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

const none = math.MinInt64

// lease is what the history says about one Lock attempt.
type lease struct {
	ref         OpRef
	lock        string
	request     int64 // none if not seen
	grant       int64
	acquireErr  int64
	done        int64
	doneErr     string
	unlockStart int64
	unlockEnd   int64
	unlockErr   string
	validUntil  int64 // latest ValidUntil read; 0 unknown
	grantValid  int64 // ValidUntil read with the grant; 0 unknown
	lastWrite   int64
	died        int64 // the worker was killed or panicked while this lease was open
}

func newLease(ref OpRef) *lease {
	return &lease{ref: ref, request: none, grant: none, acquireErr: none, done: none,
		unlockStart: none, unlockEnd: none, lastWrite: none, died: none}
}

func (l *lease) granted() bool { return l.grant != none }

// stillborn reports a grant whose holder, reading its validity with the
// grant, found none left: its worker was stopped between Lock's return and
// the record (a pause-holder fault on another of its goroutines), so the
// record comes late and the holder knew at once that it held nothing. Such a
// lease never believed itself the holder, so it overlaps nobody; its token
// still counts.
func (l *lease) stillborn() bool { return l.grantValid != 0 && l.grantValid <= l.grant }

// believedEnd is when the holder stopped believing its lease valid: the
// earliest of its Done, the start of its Unlock, the death of its process and
// the latest validity deadline it read. Without any reading it is bounded by
// one TTL from the grant.
func (l *lease) believedEnd(ttl time.Duration) int64 {
	end := l.validUntil
	if end == 0 {
		end = l.grant + int64(ttl)
	}
	for _, t := range []int64{l.done, l.unlockStart, l.died} {
		if t != none && t < end {
			end = t
		}
	}
	return end
}

// heldEnd is when the lease stopped being held as far as the history shows:
// Done, the end of its Unlock, or the death of its process, whichever came
// first; end when none did.
func (l *lease) heldEnd(end int64) int64 {
	e := end
	for _, t := range []int64{l.done, l.unlockEnd, l.died} {
		if t != none && t < e {
			e = t
		}
	}
	return max(e, l.grant)
}

// sectionEnd is the last moment the holder touched the resource in its
// critical section: its last write (none without writes).
func (l *lease) sectionEnd() int64 { return l.lastWrite }

type opKey struct {
	w, g int
	op   int64
}

// faultWindow is one injected fault, from its start to its end (the run's end
// if it never ended).
type faultWindow struct {
	fault, target string
	start, end    int64
}

func (a *analysis) index() {
	a.events = slices.Clone(a.h.Events)
	slices.SortStableFunc(a.events, func(x, y Event) int { return cmp.Compare(x.Mono, y.Mono) })
	a.start, a.end = a.h.Start, a.h.End
	if len(a.events) > 0 {
		if a.start == 0 || a.events[0].Mono < a.start {
			a.start = a.events[0].Mono
		}
		if last := a.events[len(a.events)-1].Mono; last > a.end {
			a.end = last
		}
	}
	a.rep.Start, a.rep.End = a.start, a.end

	// Faults first: kills and panics end the leases of their worker (see
	// death).
	open := map[[2]string][]int{}
	for _, e := range a.events {
		switch e.Kind {
		case KindFaultStart:
			a.rep.Faults++
			k := [2]string{e.Fault, e.Target}
			open[k] = append(open[k], len(a.windows))
			a.windows = append(a.windows, faultWindow{fault: e.Fault, target: e.Target, start: e.Mono, end: a.end})
			if !slices.Contains(a.rep.FaultNames, e.Fault) {
				a.rep.FaultNames = append(a.rep.FaultNames, e.Fault)
			}
		case KindFaultEnd:
			k := [2]string{e.Fault, e.Target}
			if q := open[k]; len(q) > 0 {
				a.windows[q[0]].end = e.Mono
				open[k] = q[1:]
				if e.Fault == FaultKillHolder {
					if w, ok := workerOf(e.Target); ok {
						a.deaths[w] = append(a.deaths[w], death{a.windows[q[0]].start, e.Mono})
					}
				}
			}
		case KindPanic:
			if e.Worker >= 0 {
				a.deaths[e.Worker] = append(a.deaths[e.Worker], death{e.Mono, e.Mono})
			}
		}
	}
	for k, q := range open {
		if k[0] != FaultKillHolder {
			continue
		}
		for _, i := range q {
			if w, ok := workerOf(k[1]); ok {
				a.deaths[w] = append(a.deaths[w], death{a.windows[i].start, a.windows[i].start})
			}
		}
	}

	cur := map[opKey]*lease{}
	get := func(e Event, fresh bool) *lease {
		k := opKey{e.Worker, e.Goroutine, e.Op}
		l := cur[k]
		// A second request for the same key starts a new attempt (a
		// replacement worker reusing its predecessor's index).
		if l == nil || (fresh && (l.request != none || l.granted())) {
			l = newLease(OpRef{Worker: e.Worker, Goroutine: e.Goroutine, Op: e.Op})
			cur[k] = l
			a.leases = append(a.leases, l)
		}
		if l.lock == "" {
			l.lock = e.Lock
		}
		return l
	}
	for _, e := range a.events {
		switch e.Kind {
		case KindRequest:
			get(e, true).request = e.Mono
		case KindGrant:
			l := get(e, false)
			if l.granted() { // a second grant for one attempt: treat as a new attempt
				l = get(Event{Worker: e.Worker, Goroutine: e.Goroutine, Op: e.Op, Lock: e.Lock}, true)
			}
			l.grant, l.ref.Token = e.Mono, e.Token
			if e.ValidUntil != 0 {
				l.validUntil, l.grantValid = e.ValidUntil, e.ValidUntil
			}
			a.rep.Grants++
		case KindAcquireError:
			l := get(e, false)
			if l.acquireErr == none {
				l.acquireErr = e.Mono
			}
			a.rep.AcquireErrors++
		case KindValid:
			if e.ValidUntil != 0 {
				get(e, false).validUntil = e.ValidUntil
			}
		case KindDone:
			l := get(e, false)
			if l.done == none {
				l.done, l.doneErr = e.Mono, e.Err
			}
		case KindUnlockStart:
			l := get(e, false)
			if l.unlockStart == none {
				l.unlockStart = e.Mono
			}
		case KindUnlockEnd:
			l := get(e, false)
			if l.unlockEnd == none {
				l.unlockEnd, l.unlockErr = e.Mono, e.Err
			}
		case KindWrite:
			a.rep.Writes++
			if !e.Accepted {
				a.rep.FenceRejected++
			}
			if l := cur[opKey{e.Worker, e.Goroutine, e.Op}]; l != nil && l.granted() {
				if e.ValidUntil != 0 {
					l.validUntil = e.ValidUntil
				}
				l.lastWrite = e.Mono
			}
		}
	}
	for _, l := range a.leases {
		if l.lock == "" {
			continue
		}
		from := l.grant
		if from == none {
			from = l.request
		}
		for _, d := range a.deaths[l.ref.Worker] {
			if at, ok := d.ends(from); ok && (l.died == none || at < l.died) {
				l.died = at
			}
		}
		if l.granted() {
			a.byLock[l.lock] = append(a.byLock[l.lock], l)
		}
	}
	for _, ls := range a.byLock {
		slices.SortStableFunc(ls, func(x, y *lease) int { return cmp.Compare(x.grant, y.grant) })
	}
}

// death is when a worker died: a panic at one moment; a kill-holder at some
// moment between the fault's start, marked before the SIGKILL, and its end,
// marked once the process has exited (from the start when the end is
// missing). The server frees a session-bound lock when the process dies, so
// another worker may be granted it before the end is marked.
type death struct{ from, to int64 }

// ends returns when a lease whose attempt began at begin ended by this
// death: at the death's start for a lease begun before it; at its own
// beginning for one begun during the kill (granted between the mark and the
// signal: the worker died some moment after, which the history does not
// tell, so the lease is not believed past its beginning); none after.
func (d death) ends(begin int64) (int64, bool) {
	switch {
	case begin <= d.from:
		return d.from, true
	case begin <= d.to:
		return begin, true
	}
	return 0, false
}

// workerOf parses a fault target "worker N".
func workerOf(target string) (int, bool) {
	var w int
	if _, err := fmt.Sscanf(strings.TrimSpace(target), "worker %d", &w); err != nil {
		return 0, false
	}
	return w, true
}
