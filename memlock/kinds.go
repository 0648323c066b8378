package memlock

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
)

// holder is one owner's grant of a read/write lock or a semaphore.
type holder struct {
	count   int
	token   uint64
	expires time.Time
	delay   time.Duration
}

// rwEntry is a read/write lock: one counter for both sides, any number of
// readers or one writer, and the marks of waiting writers.
type rwEntry struct {
	fence      uint64
	writer     string // owner of the write grant, "" when none
	w          *holder
	readers    map[string]*holder
	writeDelay time.Time            // a write hold's lock-delay: blocks everyone
	readDelay  time.Time            // read holds' lock-delays: block writers
	waiting    map[string]time.Time // waiting writers' marks: owner → expiry
}

// semEntry is a counting semaphore.
type semEntry struct {
	fence   uint64
	permits int // the stored count, binding while taken is not zero
	holders map[string]*holder
	delayed []time.Time // lock-delay deadlines of permits that expired: each keeps a permit taken
}

// SupportsKind implements driver.Kinder: memlock has every kind.
func (d *Driver) SupportsKind(k driver.Kind) bool { return k <= driver.Permit }

// Withdraw implements driver.Withdrawer: it removes a waiting writer's mark.
func (d *Driver) Withdraw(ctx context.Context, req driver.AcquireRequest) error {
	if err := d.gate(ctx, "withdraw"); err != nil {
		return err
	}
	b := d.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["withdraw"]++
	if e := b.rws[req.Name]; e != nil && req.Kind == driver.Write {
		if _, ok := e.waiting[req.Owner]; ok {
			delete(e.waiting, req.Owner)
			b.notifyLocked(req.Name)
		}
	}
	return d.lost("withdraw")
}

// TryAcquireMulti implements driver.MultiAcquirer: every mutex or none, in
// one step.
func (d *Driver) TryAcquireMulti(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	if err := d.gate(ctx, "acquire"); err != nil {
		return nil, err
	}
	gs, err := d.b.acquireMulti(reqs)
	if lerr := d.lost("acquire"); lerr != nil {
		return nil, lerr
	}
	return gs, err
}

// RaiseFence implements driver.FenceRaiser.
func (d *Driver) RaiseFence(ctx context.Context, name string, k driver.Kind, atLeast uint64) error {
	if err := d.gate(ctx, "raise"); err != nil {
		return err
	}
	b := d.b
	b.mu.Lock()
	switch k {
	case driver.Exclusive:
		e := b.locks[name]
		if e == nil {
			e = &entry{}
			b.locks[name] = e
		}
		if b.heldLocked(e, b.now()) {
			// The holder's grant is identified by its token: keep it.
			e.floor = max(e.floor, atLeast)
		} else {
			e.fence = max(e.fence, atLeast)
		}
	case driver.Read, driver.Write:
		e := b.rwLocked(name)
		e.fence = max(e.fence, atLeast)
	case driver.Permit:
		e := b.semLocked(name)
		e.fence = max(e.fence, atLeast)
	default:
		b.mu.Unlock()
		return fmt.Errorf("memlock: raise fence of kind %v: %w", k, driver.ErrUnsupported)
	}
	b.mu.Unlock()
	return d.lost("raise")
}

// DropKind forgets every current grant of kind k on name with no lock-delay
// (every reader for Read, the writer for Write, every permit for Permit, the
// holder for Exclusive), as a server that lost them would. Counters and
// waiting writers' marks survive. It reports whether anything was held.
func (b *Backend) DropKind(name string, k driver.Kind) bool {
	if k == driver.Exclusive {
		return b.Drop(name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	dropped := false
	switch k {
	case driver.Read:
		if e := b.rws[name]; e != nil && len(e.readers) > 0 {
			clear(e.readers)
			dropped = true
		}
	case driver.Write:
		if e := b.rws[name]; e != nil && e.writer != "" {
			e.writer, e.w = "", nil
			dropped = true
		}
	case driver.Permit:
		if e := b.sems[name]; e != nil && len(e.holders) > 0 {
			clear(e.holders)
			dropped = true
		}
	}
	if dropped {
		b.notifyLocked(name)
	}
	return dropped
}

func (b *Backend) rwLocked(name string) *rwEntry {
	e := b.rws[name]
	if e == nil {
		e = &rwEntry{readers: map[string]*holder{}, waiting: map[string]time.Time{}}
		b.rws[name] = e
	}
	return e
}

func (b *Backend) semLocked(name string) *semEntry {
	e := b.sems[name]
	if e == nil {
		e = &semEntry{holders: map[string]*holder{}}
		b.sems[name] = e
	}
	return e
}

// expire turns holds past their expiry into lock-delay windows and forgets
// stale waiting marks.
func (e *rwEntry) expire(now time.Time) {
	if e.w != nil && !now.Before(e.w.expires) {
		if until := e.w.expires.Add(e.w.delay); until.After(e.writeDelay) {
			e.writeDelay = until
		}
		e.writer, e.w = "", nil
	}
	for o, h := range e.readers {
		if !now.Before(h.expires) {
			if until := h.expires.Add(h.delay); until.After(e.readDelay) {
				e.readDelay = until
			}
			delete(e.readers, o)
		}
	}
	for o, until := range e.waiting {
		if !now.Before(until) {
			delete(e.waiting, o)
		}
	}
}

func (e *semEntry) expire(now time.Time) {
	for o, h := range e.holders {
		if !now.Before(h.expires) {
			if h.delay > 0 {
				e.delayed = append(e.delayed, h.expires.Add(h.delay))
			}
			delete(e.holders, o)
		}
	}
	kept := e.delayed[:0]
	for _, t := range e.delayed {
		if now.Before(t) {
			kept = append(kept, t)
		}
	}
	e.delayed = kept
}

// taken is the number of permits in use: held, or kept by a lock-delay.
func (e *semEntry) taken() int { return len(e.holders) + len(e.delayed) }

func (b *Backend) acquireRWLocked(req driver.AcquireRequest, now time.Time) (driver.Grant, error) {
	e := b.rwLocked(req.Name)
	e.expire(now)
	if req.Kind == driver.Read {
		if h := e.readers[req.Owner]; h != nil {
			h.count++
			h.expires, h.delay = now.Add(req.TTL), req.LockDelay
			return driver.Grant{Token: h.token, Count: h.count}, nil
		}
		if e.w != nil {
			return driver.Grant{}, &driver.LockedError{RetryAfter: e.w.expires.Sub(now) + e.w.delay, Token: e.fence}
		}
		if now.Before(e.writeDelay) {
			return driver.Grant{}, &driver.LockedError{RetryAfter: e.writeDelay.Sub(now), Token: e.fence}
		}
		// Writer preference: a waiting writer holds new readers back.
		var first time.Time
		for o, until := range e.waiting {
			if o != req.Owner && (first.IsZero() || until.Before(first)) {
				first = until
			}
		}
		if !first.IsZero() {
			return driver.Grant{}, &driver.LockedError{RetryAfter: first.Sub(now), Token: e.fence}
		}
		e.fence++
		e.readers[req.Owner] = &holder{count: 1, token: e.fence, expires: now.Add(req.TTL), delay: req.LockDelay}
		return driver.Grant{Token: e.fence, Count: 1}, nil
	}
	if e.w != nil && e.writer == req.Owner {
		e.w.count++
		e.w.expires, e.w.delay = now.Add(req.TTL), req.LockDelay
		return driver.Grant{Token: e.w.token, Count: e.w.count}, nil
	}
	var busyUntil time.Time
	later := func(t time.Time) {
		if t.After(busyUntil) {
			busyUntil = t
		}
	}
	if e.w != nil {
		later(e.w.expires.Add(e.w.delay))
	}
	for _, h := range e.readers {
		later(h.expires.Add(h.delay))
	}
	later(e.writeDelay)
	later(e.readDelay)
	if busyUntil.After(now) {
		if req.Waiting {
			e.waiting[req.Owner] = now.Add(req.TTL)
		}
		return driver.Grant{}, &driver.LockedError{RetryAfter: busyUntil.Sub(now), Token: e.fence}
	}
	delete(e.waiting, req.Owner)
	e.fence++
	e.writer = req.Owner
	e.w = &holder{count: 1, token: e.fence, expires: now.Add(req.TTL), delay: req.LockDelay}
	return driver.Grant{Token: e.fence, Count: 1}, nil
}

func (b *Backend) acquireSemLocked(req driver.AcquireRequest, now time.Time) (driver.Grant, error) {
	e := b.semLocked(req.Name)
	e.expire(now)
	if e.taken() > 0 && req.Permits != e.permits {
		return driver.Grant{}, fmt.Errorf("memlock: semaphore %q has %d permits while in use, the request asks for %d: %w",
			req.Name, e.permits, req.Permits, driver.ErrInvalid)
	}
	if h := e.holders[req.Owner]; h != nil {
		h.count++
		h.expires, h.delay = now.Add(req.TTL), req.LockDelay
		return driver.Grant{Token: h.token, Count: h.count}, nil
	}
	if e.taken() >= req.Permits {
		var first time.Time
		for _, h := range e.holders {
			if t := h.expires.Add(h.delay); first.IsZero() || t.Before(first) {
				first = t
			}
		}
		for _, t := range e.delayed {
			if first.IsZero() || t.Before(first) {
				first = t
			}
		}
		return driver.Grant{}, &driver.LockedError{RetryAfter: first.Sub(now), Token: e.fence}
	}
	e.permits = req.Permits
	e.fence++
	e.holders[req.Owner] = &holder{count: 1, token: e.fence, expires: now.Add(req.TTL), delay: req.LockDelay}
	return driver.Grant{Token: e.fence, Count: 1}, nil
}

// acquireMulti takes every mutex of reqs or none.
func (b *Backend) acquireMulti(reqs []driver.AcquireRequest) ([]driver.Grant, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["acquire"]++
	now := b.now()
	for _, req := range reqs {
		if req.Kind != driver.Exclusive {
			return nil, fmt.Errorf("memlock: multi-acquire of a %v lock: %w", req.Kind, driver.ErrInvalid)
		}
		if err := b.mutexBusyLocked(req, now); err != nil {
			return nil, err
		}
	}
	gs := make([]driver.Grant, len(reqs))
	for i, req := range reqs {
		g, err := b.acquireMutexLocked(req, now)
		if err != nil { // cannot happen: checked above under the same lock
			return nil, err
		}
		gs[i] = g
	}
	return gs, nil
}

// kindHolder finds l's grant, or returns ErrNotHeld.
func (b *Backend) kindHolderLocked(l driver.Lease, now time.Time, op string) (*holder, error) {
	var h *holder
	switch l.Kind {
	case driver.Read, driver.Write:
		if e := b.rws[l.Name]; e != nil {
			e.expire(now)
			if l.Kind == driver.Read {
				h = e.readers[l.Owner]
			} else if e.writer == l.Owner {
				h = e.w
			}
		}
	case driver.Permit:
		if e := b.sems[l.Name]; e != nil {
			e.expire(now)
			h = e.holders[l.Owner]
		}
	}
	if h == nil || (l.Token != 0 && h.token != l.Token) {
		return nil, fmt.Errorf("memlock: %s %q (%v): %w", op, l.Name, l.Kind, driver.ErrNotHeld)
	}
	return h, nil
}

func (b *Backend) releaseRWLocked(l driver.Lease) (int, error) {
	h, err := b.kindHolderLocked(l, b.now(), "release")
	if err != nil {
		return 0, err
	}
	h.count--
	if h.count > 0 {
		return h.count, nil
	}
	e := b.rws[l.Name]
	if l.Kind == driver.Read {
		delete(e.readers, l.Owner)
	} else {
		e.writer, e.w = "", nil
	}
	b.notifyLocked(l.Name)
	return 0, nil
}

func (b *Backend) releaseSemLocked(l driver.Lease) (int, error) {
	h, err := b.kindHolderLocked(l, b.now(), "release")
	if err != nil {
		return 0, err
	}
	h.count--
	if h.count > 0 {
		return h.count, nil
	}
	delete(b.sems[l.Name].holders, l.Owner)
	b.notifyLocked(l.Name)
	return 0, nil
}

func (b *Backend) renewKindLocked(l driver.Lease, now time.Time) error {
	h, err := b.kindHolderLocked(l, now, "renew")
	if err != nil {
		return err
	}
	h.expires = now.Add(l.TTL)
	return nil
}

// inspectKindsLocked lists the read/write locks and semaphores under prefix.
func (b *Backend) inspectKindsLocked(prefix string, now time.Time) []driver.LockInfo {
	var out []driver.LockInfo
	for name, e := range b.rws {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		e.expire(now)
		info := driver.LockInfo{Name: name, Kind: driver.Write, Token: e.fence,
			Waiters: len(b.subs[name]) + len(e.waiting), Readers: len(e.readers)}
		if e.w != nil {
			info.Owner, info.Count, info.ExpiresIn = e.writer, e.w.count, e.w.expires.Sub(now)
		}
		for _, h := range e.readers {
			info.Count += h.count
			info.ExpiresIn = max(info.ExpiresIn, h.expires.Sub(now))
		}
		out = append(out, info)
	}
	for name, e := range b.sems {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		e.expire(now)
		info := driver.LockInfo{Name: name, Kind: driver.Permit, Token: e.fence,
			Waiters: len(b.subs[name]), Permits: e.permits, Holders: len(e.holders)}
		for _, h := range e.holders {
			info.Count += h.count
			info.ExpiresIn = max(info.ExpiresIn, h.expires.Sub(now))
		}
		out = append(out, info)
	}
	return out
}
