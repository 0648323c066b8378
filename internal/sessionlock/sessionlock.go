// Package sessionlock holds the logic that the session-bound, queue-based
// drivers (etcdlock, zklock: a grant lives as long as a backend session, and
// waiters queue in the backend) share and that does not depend on their
// backend: the per-driver re-entrance bookkeeping keyed by (name, owner),
// the liveness record of a backend session and the driver's background
// goroutines. Each driver keeps only its own round trips.
package sessionlock

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock/dlock/driver"
)

// holdKey identifies a (name, owner) pair by two independent 64-bit hashes
// of it (maphash, seeded at random per process), so that a hold costs 16
// bytes of key instead of two strings. Two pairs are mistaken for one only
// if both hashes collide: with n holds, a chance below n²/2¹²⁹ (10⁻²⁷ at a
// million holds), far below that of a memory error.
type holdKey struct{ a, b uint64 }

var holdSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func keyOf(name, owner string) holdKey {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(name)))
	var k [2]uint64
	for i, seed := range holdSeeds {
		var h maphash.Hash
		h.SetSeed(seed)
		h.Write(n[:]) // the length makes (name, owner) → bytes one to one
		h.WriteString(name)
		h.WriteString(owner)
		k[i] = h.Sum64()
	}
	return holdKey{k[0], k[1]}
}

// HoldName is the name under which Holds records a grant of kind k of the
// lock name: name itself for a mutex, and a name no lock can have (names
// hold no control characters) for the other kinds, so that the mutex, the
// read/write lock and the semaphore of one name, and the read and write
// sides of its read/write lock, are counted apart. Drivers pass it as the
// name argument of Holds' methods, and may use it to key other per-lock
// state.
func HoldName(k driver.Kind, name string) string {
	if k == driver.Exclusive {
		return name
	}
	return "\x00" + k.String() + "\x00" + name
}

// hold is the local record of one (name, owner) grant, kept by value in
// Holds.m.
type hold[H comparable] struct {
	h     H      // the grant's handle; the zero H while the first acquire is in flight
	count int32  // 0 while the first acquire is in flight
	gen   uint32 // tells this record from an earlier or later one of the same key
}

// Holds is a driver's record of the grants it holds, keyed by (name, owner)
// (the name a HoldName, for kinds beyond the mutex):
// the same owner taking the same name again through the same driver
// increments a hold count instead of queueing behind itself. H is the
// driver's handle type (a pointer). The zero value is ready to use; a Holds
// is safe for concurrent use.
type Holds[H comparable] struct {
	mu sync.Mutex
	m  map[holdKey]hold[H]
	// pending holds, for each key whose first acquire is in flight (count
	// 0 in m), a channel closed when that acquire ends.
	pending map[holdKey]chan struct{}
	gen     uint32
}

// startLocked records an acquire of hk in flight (hs.mu held, hk absent) and
// returns the record's generation.
func (hs *Holds[H]) startLocked(hk holdKey) uint32 {
	if hs.m == nil {
		hs.m = map[holdKey]hold[H]{}
		hs.pending = map[holdKey]chan struct{}{}
	}
	hs.gen++
	hs.m[hk] = hold[H]{gen: hs.gen}
	hs.pending[hk] = make(chan struct{})
	return hs.gen
}

// finishLocked ends the acquire of hk in flight (hs.mu held): it wakes the
// calls waiting for it.
func (hs *Holds[H]) finishLocked(hk holdKey) {
	close(hs.pending[hk])
	delete(hs.pending, hk)
}

// Check reports whether the backend still has h's grant in place, and the
// send time of the request that showed it (from which the grant lasts at
// least its TTL).
type Check[H comparable] func(h H) (ok bool, sent time.Time, err error)

// Ops are the backend round trips that Holds.Acquire drives.
type Ops[H comparable] struct {
	// Enqueue takes the lock afresh (queueing when the call waits) and
	// returns its grant, whose Handle is an H.
	Enqueue func() (driver.Grant, error)
	// Again, when not nil, takes Enqueue's place after Check reported the
	// hold's grant gone, with that grant's handle prev. A check can be
	// wrong (a stale read, a lost reply): when Again finds prev's grant
	// still in place, it returns that grant (same Token, Handle prev)
	// rather than queueing a new one behind it, and the hold is counted
	// once more with its handle, as a re-entry (Reenter included).
	Again func(prev H) (driver.Grant, error)
	// Check confirms an existing grant before it is counted again.
	Check Check[H]
	// Reenter, when not nil, runs after a re-entrant grant was counted
	// (e.g. to write a lock-delay guard); an error undoes the count.
	Reenter func(h H) error
	// Grant describes h held count times, confirmed by a request sent at
	// sent.
	Grant func(h H, count int, sent time.Time) driver.Grant
}

// Acquire takes the lock name for owner. When the driver holds it for owner
// already, it confirms the grant with ops.Check and counts it once more;
// when the driver no longer has it in place, the hold is forgotten and the
// lock taken afresh. While another acquire of the same (name, owner) is in
// flight, a waiting call (wait set) waits for it and then re-enters or
// starts afresh, and a non-waiting one returns a *driver.LockedError. When
// the fresh acquire after a failed check finds the very grant the check
// reported gone (see Ops.Again), the hold keeps its handle and count and is
// re-entered: a re-entry of a grant still in place is never refused. what
// prefixes the error returned when ctx ends while waiting.
func (hs *Holds[H]) Acquire(ctx context.Context, name, owner string, wait bool, what string, ops Ops[H]) (driver.Grant, error) {
	hk := keyOf(name, owner)
	// dropped is a hold that Check reported gone; if the fresh enqueue finds
	// the very same grant (same token: create revisions and czxids are
	// unique), the check was wrong, and the hold is taken back with its
	// handle and count rather than restarted at one.
	var dropped hold[H]
	haveDropped := false
	for {
		hs.mu.Lock()
		h, ok := hs.m[hk]
		if !ok {
			gen := hs.startLocked(hk)
			hs.mu.Unlock()
			var g driver.Grant
			var err error
			if haveDropped && ops.Again != nil {
				g, err = ops.Again(dropped.h)
			} else {
				g, err = ops.Enqueue()
			}
			hs.mu.Lock()
			// No one else changes or deletes a record in flight.
			again := false
			var n int32
			switch {
			case err != nil:
				delete(hs.m, hk)
			case haveDropped && ops.Grant(dropped.h, 1, g.Sent).Token == g.Token:
				n = dropped.count + 1
				hs.m[hk] = hold[H]{h: dropped.h, count: n, gen: gen}
				again = true
			default:
				n = 1
				hs.m[hk] = hold[H]{h: g.Handle.(H), count: 1, gen: gen}
			}
			hs.finishLocked(hk)
			hs.mu.Unlock()
			if again {
				return hs.reenter(hk, gen, dropped.h, int(n), g.Sent, ops)
			}
			return g, err
		}
		if h.count == 0 {
			// The same owner is acquiring the same name already: wait for
			// that attempt, then re-enter or start afresh.
			p := hs.pending[hk]
			hs.mu.Unlock()
			if !wait {
				return driver.Grant{}, &driver.LockedError{}
			}
			select {
			case <-p:
				continue
			case <-ctx.Done():
				return driver.Grant{}, fmt.Errorf("%s: %w", what, ctx.Err())
			}
		}
		hd, gen := h.h, h.gen
		hs.mu.Unlock()
		// Re-entrance: make sure the grant is still ours before counting.
		ok, sent, err := ops.Check(hd)
		if err != nil {
			return driver.Grant{}, err
		}
		hs.mu.Lock()
		cur, exists := hs.m[hk]
		if !exists || cur.gen != gen || cur.count == 0 || cur.h != hd {
			hs.mu.Unlock()
			continue // released or replaced meanwhile
		}
		if !ok {
			delete(hs.m, hk) // lost: the old lease will see ErrNotHeld
			dropped, haveDropped = cur, true
			hs.mu.Unlock()
			continue
		}
		cur.count++
		hs.m[hk] = cur
		hs.mu.Unlock()
		return hs.reenter(hk, gen, hd, int(cur.count), sent, ops)
	}
}

// Begin marks an acquire of (name, owner) that the caller makes outside
// Acquire (several locks in one round trip), so that no Acquire of the same
// (name, owner) runs meanwhile. It reports false, changing nothing, when
// the driver holds (name, owner) already or another acquire of it is in
// flight: the caller must not take it then. Every Begin that reported true
// is followed by one End.
func (hs *Holds[H]) Begin(name, owner string) bool {
	hk := keyOf(name, owner)
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if _, ok := hs.m[hk]; ok {
		return false
	}
	hs.startLocked(hk)
	return true
}

// End ends an acquire marked with Begin: the driver holds (name, owner)
// once through h when granted is set, and not at all otherwise.
func (hs *Holds[H]) End(name, owner string, h H, granted bool) {
	hk := keyOf(name, owner)
	hs.mu.Lock()
	defer hs.mu.Unlock()
	cur, ok := hs.m[hk]
	if !ok || cur.count != 0 {
		return
	}
	if granted {
		hs.m[hk] = hold[H]{h: h, count: 1, gen: cur.gen}
	} else {
		delete(hs.m, hk)
	}
	hs.finishLocked(hk)
}

// reenter finishes a re-entry that counted the record gen of hk (whose
// handle is hd) up to n: it runs ops.Reenter, whose error undoes the count,
// and describes the grant confirmed by a request sent at sent.
func (hs *Holds[H]) reenter(hk holdKey, gen uint32, hd H, n int, sent time.Time, ops Ops[H]) (driver.Grant, error) {
	if ops.Reenter != nil {
		if err := ops.Reenter(hd); err != nil {
			hs.mu.Lock()
			if cur, ok := hs.m[hk]; ok && cur.gen == gen && cur.count > 1 {
				cur.count--
				hs.m[hk] = cur
			}
			hs.mu.Unlock()
			return driver.Grant{}, err
		}
	}
	return ops.Grant(hd, n, sent), nil
}

// Release counts down the hold of (name, owner) through hd. When that hold
// counts more than one, it confirms with check that the grant is still in
// place, then counts it down and returns the count left with nested true; if
// check finds the grant gone, the hold is forgotten and gone() returned as
// the error. Otherwise it forgets the hold (when it is hd's) and returns
// nested false: the caller then deletes the backend's record of the grant.
//
// A nested release whose check fails (err from check) changes nothing, so
// the caller may call Release again for the same hold: a hold is never
// counted down twice for one release that failed and was retried.
func (hs *Holds[H]) Release(name, owner string, hd H, check Check[H], gone func() error) (n int, nested bool, err error) {
	hk := keyOf(name, owner)
	for {
		hs.mu.Lock()
		h, ok := hs.m[hk]
		if ok && h.count > 1 && h.h == hd {
			gen := h.gen
			hs.mu.Unlock()
			ok, _, err := check(hd)
			if err != nil {
				return 0, true, err
			}
			if !ok {
				hs.forget(hk, hd)
				return 0, true, gone()
			}
			hs.mu.Lock()
			cur, exists := hs.m[hk]
			if !exists || cur.gen != gen || cur.h != hd || cur.count <= 1 {
				hs.mu.Unlock()
				continue // released or replaced meanwhile: look again
			}
			cur.count--
			hs.m[hk] = cur
			hs.mu.Unlock()
			return int(cur.count), true, nil
		}
		if ok && h.count > 0 && h.h == hd {
			delete(hs.m, hk)
		}
		hs.mu.Unlock()
		return 0, false, nil
	}
}

func (hs *Holds[H]) forget(hk holdKey, hd H) {
	hs.mu.Lock()
	if h, ok := hs.m[hk]; ok && h.count > 0 && h.h == hd {
		delete(hs.m, hk)
	}
	hs.mu.Unlock()
}

// Count returns the hold count of (name, owner) when the driver holds it
// through a handle for which match is true, else 1.
func (hs *Holds[H]) Count(name, owner string, match func(H) bool) int {
	var zero H
	hk := keyOf(name, owner)
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if h, ok := hs.m[hk]; ok && h.h != zero && match(h.h) {
		return int(h.count)
	}
	return 1
}

// Busy reports whether an acquire is in flight or a hold's handle satisfies
// match.
func (hs *Holds[H]) Busy(match func(H) bool) bool {
	var zero H
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if len(hs.pending) > 0 {
		return true
	}
	for _, h := range hs.m {
		if h.h != zero && match(h.h) {
			return true
		}
	}
	return false
}

// Session is the liveness record of one backend session (an etcd lease, a
// ZooKeeper session): when the server last confirmed it, and whether and why
// it ended. Its end is a context cancelled with the cause, so Done and Cause
// are what a driver.Grant's Lost and Cause need. It is safe for concurrent
// use. Create it with NewSession.
type Session struct {
	ctx context.Context // cancelled with the cause when the session ends
	end context.CancelCauseFunc

	refreshed Stamp // send time of the last request the server confirmed

	cause func() error // Cause, made once: a Grant.Cause for every grant
}

// NewSession returns a live session confirmed by a request sent at sent.
func NewSession(sent time.Time) *Session {
	ctx, end := context.WithCancelCause(context.Background())
	s := &Session{ctx: ctx, end: end}
	s.cause = s.Cause
	s.refreshed.Record(sent)
	return s
}

// Refresh records that a request sent at sent was confirmed: the session
// lasts at least its TTL from then.
func (s *Session) Refresh(sent time.Time) { s.refreshed.Record(sent) }

// RefreshedAt is the send time of the last confirmed request.
func (s *Session) RefreshedAt() time.Time { return s.refreshed.Time() }

// End ends the session with cause, which must not be nil. Only the first
// call has an effect.
func (s *Session) End(cause error) { s.end(cause) }

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Lost reports whether the session has ended.
func (s *Session) Lost() bool { return s.ctx.Err() != nil }

// Cause is why the session ended; nil while it lives.
func (s *Session) Cause() error {
	if !s.Lost() {
		return nil
	}
	return context.Cause(s.ctx)
}

// CauseFunc returns s.Cause as a func made once per session, for the
// Grant.Cause of each grant (a method value would be allocated per grant).
func (s *Session) CauseFunc() func() error { return s.cause }

// Group runs a driver's background goroutines. Stop cancels its context and
// waits for them. It is safe for concurrent use. Create it with NewGroup.
type Group struct {
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex // guards stopped and wg.Add
	stopped bool
	wg      sync.WaitGroup
}

// NewGroup returns a running group.
func NewGroup() *Group {
	ctx, cancel := context.WithCancel(context.Background())
	return &Group{ctx: ctx, cancel: cancel}
}

// Context is done once Stop was called.
func (g *Group) Context() context.Context { return g.ctx }

// Go runs f on a goroutine that Stop waits for, unless the group has stopped
// (then it returns false).
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// Stop cancels the group's context and waits for its goroutines.
func (g *Group) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.cancel()
	g.mu.Unlock()
	g.wg.Wait()
}

// Stamp holds the latest of the times recorded in it, such as the send time
// of the last request that confirmed a session or a grant. The zero value
// holds the zero time; a Stamp is safe for concurrent use. It is one word
// (a driver keeps one per held grant): a time is kept as its distance from
// the process's stampBase on the monotonic clock, so Time returns a time
// with a monotonic reading, at the same instant as the one recorded.
type Stamp struct {
	ns atomic.Int64 // 1 + the time's distance from stampBase in ns; 0: none
}

// stampBase is the origin of Stamps. Every time a driver records was taken
// later, with time.Now.
var stampBase = time.Now()

// Record records t unless a later time is recorded already.
func (s *Stamp) Record(t time.Time) {
	if t.IsZero() {
		return
	}
	v := 1 + max(int64(t.Sub(stampBase)), 0)
	for {
		old := s.ns.Load()
		if v <= old || s.ns.CompareAndSwap(old, v) {
			return
		}
	}
}

// Time returns the latest time recorded.
func (s *Stamp) Time() time.Time {
	v := s.ns.Load()
	if v == 0 {
		return time.Time{}
	}
	return stampBase.Add(time.Duration(v - 1))
}
