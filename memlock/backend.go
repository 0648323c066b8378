package memlock

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// Backend is the in-memory "server". It is safe for concurrent use.
type Backend struct {
	mu    sync.Mutex
	locks map[string]*entry    // mutexes
	rws   map[string]*rwEntry  // read/write locks
	sems  map[string]*semEntry // semaphores
	skew  time.Duration
	subs  map[string]map[*sub]struct{}
	seq   uint64 // the last subscription's number
	// standing counts, by name, the attempts standing back for its next
	// grant (see nextGrant): waiters not subscribed yet.
	standing map[string]int
	calls    map[string]int // count of calls by operation, for tests
}

type entry struct {
	owner      string
	count      int
	fence      uint64
	floor      uint64    // a RaiseFence while held: the next grant's token is above it
	expires    time.Time // server time; zero when free
	delayUntil time.Time // lock-delay deadline after an expiry
	delay      time.Duration
	// granted, when not nil, is closed at the next grant (a Driver standing
	// back waits on it, see standBack).
	granted chan struct{}
}

// closed is the channel of a grant that has happened (see nextGrant).
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// NewBackend returns an empty backend.
func NewBackend() *Backend {
	return &Backend{locks: map[string]*entry{}, rws: map[string]*rwEntry{}, sems: map[string]*semEntry{},
		subs: map[string]map[*sub]struct{}{}, standing: map[string]int{}, calls: map[string]int{}}
}

func (b *Backend) now() time.Time { return time.Now().Add(b.skew) }

// SkewClock moves the backend's clock by d (forward if positive), as a clock
// jump on a server would.
func (b *Backend) SkewClock(d time.Duration) {
	b.mu.Lock()
	b.skew += d
	b.mu.Unlock()
}

// Calls returns how many times op ("acquire", "release", "renew") reached
// the backend.
func (b *Backend) Calls(op string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[op]
}

// Drop forgets the current grant on the mutex name with no lock-delay, as a
// server that lost it would. The fencing counter survives. DropKind does the
// same for the other lock kinds.
func (b *Backend) Drop(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.locks[name]
	if e == nil || e.count == 0 {
		return false
	}
	e.count, e.owner, e.expires, e.delayUntil = 0, "", time.Time{}, time.Time{}
	b.notifyLocked(name)
	return true
}

// Holder returns the current owner and token of name ("" if free).
func (b *Backend) Holder(name string) (owner string, token uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.locks[name]
	if e == nil || !b.heldLocked(e, b.now()) {
		return "", 0
	}
	return e.owner, e.fence
}

func (b *Backend) heldLocked(e *entry, now time.Time) bool {
	if e.count == 0 {
		return false
	}
	if now.Before(e.expires) {
		return true
	}
	// Expired: turn it into a lock-delay window once.
	e.count, e.owner = 0, ""
	e.delayUntil = e.expires.Add(e.delay)
	e.expires = time.Time{}
	return false
}

// notifyLocked wakes every subscriber of name; it reports whether there
// was any.
func (b *Backend) notifyLocked(name string) bool {
	for s := range b.subs[name] {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
	return len(b.subs[name]) > 0
}

// wakeRestAfter is how long a mutex release leaves the lock to the
// longest-waiting subscriber it woke before it wakes the others too.
const wakeRestAfter = 10 * time.Millisecond

// notifyFirstLocked wakes the longest-waiting subscriber of the mutex
// name, freed by a release: it is the one to take the lock next, as in a
// FIFO queue (waking them all made them race, and with 9 contenders one
// waited 4 s while others were granted again and again). If the lock has
// not been granted wakeRestAfter later (that subscriber's driver is paused,
// or its Lock has moved on), every subscriber is woken. It reports whether
// there was any subscriber.
func (b *Backend) notifyFirstLocked(name string) bool {
	var first *sub
	for s := range b.subs[name] {
		if first == nil || s.seq < first.seq {
			first = s
		}
	}
	if first == nil {
		return false
	}
	select {
	case first.c <- struct{}{}:
	default:
	}
	if len(b.subs[name]) > 1 {
		fence := b.locks[name].fence
		time.AfterFunc(wakeRestAfter, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if e := b.locks[name]; e != nil && e.fence == fence {
				b.notifyLocked(name)
			}
		})
	}
	return true
}

// acquire grants req if name is free, or re-enters it for the same owner.
func (b *Backend) acquire(req driver.AcquireRequest) (driver.Grant, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["acquire"]++
	now := b.now()
	switch req.Kind {
	case driver.Read, driver.Write:
		return b.acquireRWLocked(req, now)
	case driver.Permit:
		return b.acquireSemLocked(req, now)
	}
	return b.acquireMutexLocked(req, now)
}

// mutexBusyLocked returns the refusal a mutex request would get, or nil.
func (b *Backend) mutexBusyLocked(req driver.AcquireRequest, now time.Time) error {
	e := b.locks[req.Name]
	if e == nil {
		return nil
	}
	if b.heldLocked(e, now) {
		if e.owner != req.Owner {
			return &driver.LockedError{RetryAfter: e.expires.Sub(now) + e.delay, Token: e.fence}
		}
		return nil
	}
	if now.Before(e.delayUntil) {
		return &driver.LockedError{RetryAfter: e.delayUntil.Sub(now), Token: e.fence}
	}
	return nil
}

func (b *Backend) acquireMutexLocked(req driver.AcquireRequest, now time.Time) (driver.Grant, error) {
	e := b.locks[req.Name]
	if e == nil {
		e = &entry{}
		b.locks[req.Name] = e
	}
	if b.heldLocked(e, now) {
		if e.owner != req.Owner {
			return driver.Grant{}, &driver.LockedError{RetryAfter: e.expires.Sub(now) + e.delay, Token: e.fence}
		}
		e.count++
		e.expires = now.Add(req.TTL)
		e.delay = req.LockDelay
		return driver.Grant{Token: e.fence, Count: e.count}, nil
	}
	if now.Before(e.delayUntil) {
		return driver.Grant{}, &driver.LockedError{RetryAfter: e.delayUntil.Sub(now), Token: e.fence}
	}
	e.fence = max(e.fence, e.floor) + 1
	e.owner, e.count = req.Owner, 1
	if e.granted != nil {
		close(e.granted)
		e.granted = nil
	}
	e.expires = now.Add(req.TTL)
	e.delay = req.LockDelay
	e.delayUntil = time.Time{}
	return driver.Grant{Token: e.fence, Count: 1}, nil
}

// nextGrant returns a channel closed at name's next mutex grant after the
// release of the grant with token released, for an attempt that stands
// back: closed already when the name was granted since. Until it calls
// stoodBack, the attempt counts as a waiter of name.
func (b *Backend) nextGrant(name string, released uint64) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.standing[name]++
	e := b.locks[name]
	if e == nil {
		e = &entry{}
		b.locks[name] = e
	}
	if e.fence > released {
		return closed
	}
	if e.granted == nil {
		e.granted = make(chan struct{})
	}
	return e.granted
}

// stoodBack records that an attempt that stood back (see nextGrant) has
// been made.
func (b *Backend) stoodBack(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.standing[name]--; b.standing[name] <= 0 {
		delete(b.standing, name)
	}
}

// release gives up one hold of l; it returns the holds left, and whether
// the last release of a mutex woke subscribers.
func (b *Backend) release(l driver.Lease) (int, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["release"]++
	switch l.Kind {
	case driver.Read, driver.Write:
		n, err := b.releaseRWLocked(l)
		return n, false, err
	case driver.Permit:
		n, err := b.releaseSemLocked(l)
		return n, false, err
	}
	e := b.locks[l.Name]
	if e == nil || !b.heldLocked(e, b.now()) || e.owner != l.Owner || (l.Token != 0 && e.fence != l.Token) {
		return 0, false, fmt.Errorf("memlock: release %q: %w", l.Name, driver.ErrNotHeld)
	}
	e.count--
	if e.count > 0 {
		return e.count, false, nil
	}
	e.owner, e.expires, e.delayUntil = "", time.Time{}, time.Time{}
	woke := b.notifyFirstLocked(l.Name)
	return 0, woke || b.standing[l.Name] > 0, nil
}

// renew extends every lease of ls that its owner still holds.
func (b *Backend) renew(ls []driver.Lease) []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["renew"]++
	now := b.now()
	errs := make([]error, len(ls))
	for i, l := range ls {
		if l.Kind != driver.Exclusive {
			errs[i] = b.renewKindLocked(l, now)
			continue
		}
		e := b.locks[l.Name]
		if e == nil || !b.heldLocked(e, now) || e.owner != l.Owner || e.fence != l.Token {
			errs[i] = fmt.Errorf("memlock: renew %q: %w", l.Name, driver.ErrNotHeld)
			continue
		}
		e.expires = now.Add(l.TTL)
	}
	return errs
}

// inspect lists the locks whose names start with prefix.
func (b *Backend) inspect(prefix string) []driver.LockInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	var out []driver.LockInfo
	for name, e := range b.locks {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		info := driver.LockInfo{Name: name, Token: e.fence, Waiters: len(b.subs[name])}
		if b.heldLocked(e, now) {
			info.Owner, info.Count, info.ExpiresIn = e.owner, e.count, e.expires.Sub(now)
		}
		out = append(out, info)
	}
	out = append(out, b.inspectKindsLocked(prefix, now)...)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}
