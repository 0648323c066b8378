package sqlcommon

import "time"

// epoch is the origin of the instants in expiries, read with the
// monotonic clock.
var epoch = time.Now()

// expiries is the timetable of a Sessions' holds: each listed hold by when
// it expires, in a binary min-heap, and one timer armed for the earliest.
// A hold is listed at its grant, moved when a Ping confirms it, and taken
// off when its connection is zeroed (release, loss, expiry, Close, Kill);
// see Sessions.schedule and unschedule. The timer is armed again only when
// a hold listed expires before the instant it is armed for, or when it has
// fired; it is not stopped when a hold leaves. So a stream of uncontended
// Lock+Unlock with one TTL arms it about once per TTL (it fires, finds the
// holds that were listed gone, and is armed for the earliest one left),
// not once per hold, while each hold still expires when its time comes.
// Sessions.expMu guards it.
type expiries[C Conn] struct {
	heap  []expiry[C]
	timer SharedTimer
	at    time.Duration // when the timer is set to fire, since epoch
}

// expiry is one hold in the timetable and when it expires, since epoch.
type expiry[C Conn] struct {
	end time.Duration
	h   *Hold[C]
}

// schedule lists h in s's expiries at the instant it expires now, or moves
// it there if it is listed, and arms the timer earlier if h expires before
// it fires; h.mu is held.
func (s *Sessions[C]) schedule(h *Hold[C]) {
	end := h.expires().Sub(epoch)
	s.expMu.Lock()
	e := &s.exp
	if h.at == 0 {
		e.heap = append(e.heap, expiry[C]{end: end, h: h})
		h.at = len(e.heap)
		e.up(len(e.heap) - 1)
	} else {
		e.heap[h.at-1].end = end
		e.fix(h.at - 1)
	}
	if !e.timer.Armed() || end < e.at {
		s.arm(end, time.Since(epoch))
	}
	s.expMu.Unlock()
}

// unschedule takes h off s's expiries if it is listed; h.mu is held. The
// timer is left as it is.
func (s *Sessions[C]) unschedule(h *Hold[C]) {
	s.expMu.Lock()
	if h.at != 0 {
		s.exp.remove(h.at - 1)
	}
	s.expMu.Unlock()
}

// arm sets s's expiry timer to fire at end (since epoch), now being now;
// s.expMu is held.
func (s *Sessions[C]) arm(end, now time.Duration) {
	s.exp.at = end
	s.exp.timer.Arm(end-now, s.fireExpiries)
}

// fireExpiries runs when s's expiry timer fires: it takes the holds due
// off the timetable, arms the timer for the earliest one left, and then
// ends each hold due that has expired (expireHold lists again one a Ping
// confirmed meanwhile).
func (s *Sessions[C]) fireExpiries() {
	var due []*Hold[C]
	s.expMu.Lock()
	e := &s.exp
	now := time.Since(epoch)
	for len(e.heap) > 0 && e.heap[0].end <= now {
		due = append(due, e.heap[0].h)
		e.remove(0)
	}
	e.timer.Fired()
	if len(e.heap) > 0 {
		s.arm(e.heap[0].end, now)
	}
	s.expMu.Unlock()
	// Every loss is signalled before any connection is closed (a close
	// may take up to its own timeout on a dead network), and the closes
	// of several run side by side, as each hold's own timer ran them.
	var conns []C
	for _, h := range due {
		if conn, ok := s.expireHold(h); ok {
			conns = append(conns, conn)
		}
	}
	for i, conn := range conns {
		if i == len(conns)-1 {
			conn.Discard()
		} else {
			go conn.Discard()
		}
	}
}

// stopExpiries stops s's expiry timer (Close, Kill: the holds are all
// gone). A hold listed later arms it again.
func (s *Sessions[C]) stopExpiries() {
	s.expMu.Lock()
	s.exp.timer.Stop()
	s.expMu.Unlock()
}

// remove takes the i-th entry off the heap.
func (e *expiries[C]) remove(i int) {
	n := len(e.heap) - 1
	e.heap[i].h.at = 0
	if i != n {
		e.heap[i] = e.heap[n]
		e.heap[i].h.at = i + 1
	}
	e.heap[n] = expiry[C]{}
	e.heap = e.heap[:n]
	if i != n {
		e.fix(i)
	}
	if c := cap(e.heap); c > 64 && n < c/4 {
		e.heap = append([]expiry[C](nil), e.heap...)
	}
}

// fix restores the heap order after the i-th entry's end changed.
func (e *expiries[C]) fix(i int) {
	if !e.down(i) {
		e.up(i)
	}
}

func (e *expiries[C]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if e.heap[i].end <= e.heap[j].end {
			break
		}
		e.swap(i, j)
		j = i
	}
}

func (e *expiries[C]) down(i0 int) bool {
	i, n := i0, len(e.heap)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if j2 := j + 1; j2 < n && e.heap[j2].end < e.heap[j].end {
			j = j2
		}
		if e.heap[j].end >= e.heap[i].end {
			break
		}
		e.swap(i, j)
		i = j
	}
	return i > i0
}

func (e *expiries[C]) swap(i, j int) {
	e.heap[i], e.heap[j] = e.heap[j], e.heap[i]
	e.heap[i].h.at = i + 1
	e.heap[j].h.at = j + 1
}
