package sqlcommon

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/ctxerr"
)

// Lock kinds beyond the mutex (read/write locks and semaphores) live in two
// tables next to the mutex table, which they never touch:
//
//	<table>_kinds   (name, grp) → fence, permits
//	<table>_holders (name, grp, owner, kind) → count, fence, lock_until, delay_until
//
// grp is GroupRW for a name's read/write lock and GroupSem for its
// semaphore, so the mutex, the read/write lock and the semaphore of one
// name are three locks. The _kinds row is the lock's state: its fencing
// counter (shared by read and write grants; a semaphore's its own) and a
// semaphore's permit count; rows are never deleted, so counters never go
// back. A _holders row is one holder: a reader, a writer, a permit, or a
// waiting writer's mark (KindMark), each with its own token, lease and
// lock-delay; a release deletes it, so a released place is free at once.
// Times are microseconds since the Unix epoch by the server's clock.
//
// An acquire is one transaction: the _kinds row is upserted and locked
// first (every acquire of the lock serialises on it), the _holders rows
// are read after that (so a statement snapshot taken before the lock wait
// cannot hide a holder committed meanwhile), DecideKind decides in Go,
// and the writes it asks for commit with the transaction. Release and
// renewal are single statements on the holder's own row, matched by
// owner, kind and token and only while its lease is unexpired.

// The grp column of the kinds tables.
const (
	GroupRW  = 1 // a read/write lock: Read, Write and KindMark rows
	GroupSem = 2 // a semaphore: Permit rows
)

// KindMark is the kind column of a waiting writer's mark: a refused Write
// request with Waiting set leaves one (lock_until = now + TTL, renewed by
// each refused attempt), and while it is unexpired new Read requests of
// other owners are refused. A Write grant to its owner and Withdraw delete
// it.
const KindMark = 9

// Group returns the grp of kind k.
func Group(k driver.Kind) int {
	if k == driver.Permit {
		return GroupSem
	}
	return GroupRW
}

// KindState is the _kinds row of a lock as the acquiring transaction found
// it after locking it, with the server's clock read then.
type KindState struct {
	Fence   int64 // the counter: the last token granted (or raised to)
	Permits int   // a semaphore's stored permit count; 0 when not yet set
	Now     int64 // the server's clock, µs since the epoch
}

// Holder is one _holders row.
type Holder struct {
	Owner      string
	Kind       int // driver.Read, driver.Write, driver.Permit or KindMark
	Count      int
	Fence      int64
	LockUntil  int64 // µs: the lease's end
	DelayUntil int64 // µs: LockUntil plus the grant's lock-delay
}

// KindPlan is DecideKind's verdict: the grant or refusal, and the writes
// the transaction must make before it commits.
type KindPlan struct {
	// Err, when not nil, refuses the request as bad input (a permit count
	// that differs from the stored one); nothing is written.
	Err error
	// Granted is true for a grant of Token with hold Count.
	Granted bool
	Token   uint64
	Count   int
	// Locked is the refusal when not Granted (and Err is nil).
	Locked *driver.LockedError
	// Fence and Permits are the _kinds row's new values; SetState says
	// whether they differ from the state read.
	SetState bool
	Fence    int64
	Permits  int
	// Put is the _holders row to insert or overwrite, if any.
	Put *Holder
	// Delete lists _holders rows (owner, kind) to delete: holders past
	// their lock-delay, and the owner's own mark on a Write grant.
	Delete []Holder
}

// Writes reports whether p changes anything.
func (p KindPlan) Writes() bool { return p.SetState || p.Put != nil || len(p.Delete) > 0 }

// DecideKind decides an acquire of req (Kind Read, Write or Permit) given
// the lock's state and its holder rows, read in the same transaction after
// the state row was locked. The rules are driver/kinds.go's:
//   - a holder blocks others until its DelayUntil; a release deletes it;
//   - the same owner holding the same kind with an unexpired lease
//     re-enters (count up, token unchanged, TTL reset); the same owner's
//     row that expired but is still inside its lock-delay refuses it;
//   - Read: refused while a Write is held (by anyone, the owner included)
//     or another owner's mark is unexpired;
//   - Write: refused while any other holder is live, or the owner itself
//     holds Read (an upgrade); a refusal with Waiting set leaves or renews
//     the owner's mark;
//   - Permit: refused while Permits holders are live (or inside their
//     lock-delay); a Permits that differs from the stored count is an
//     error wrapping ErrInvalid while the semaphore is in use, and resizes
//     it when idle;
//   - every new grant takes the counter plus one as its token.
func DecideKind(st KindState, hs []Holder, req driver.AcquireRequest) KindPlan {
	now := st.Now
	ttl, delay := Micros(req.TTL), Micros(req.LockDelay)
	p := KindPlan{Fence: st.Fence, Permits: st.Permits}
	if req.Kind == driver.Permit {
		if req.Permits < 1 {
			return KindPlan{Err: fmt.Errorf("semaphore %q: %d permits: must be at least 1: %w", req.Name, req.Permits, driver.ErrInvalid)}
		}
		inUse := false
		for _, h := range hs {
			inUse = inUse || h.DelayUntil > now
		}
		if inUse && st.Permits != 0 && st.Permits != req.Permits {
			return KindPlan{Err: fmt.Errorf("semaphore %q has %d permits while in use, the request asks for %d: %w", req.Name, st.Permits, req.Permits, driver.ErrInvalid)}
		}
		if st.Permits != req.Permits {
			// New, or idle: the semaphore takes this grant's count.
			p.Permits, p.SetState = req.Permits, true
		}
	}
	var (
		own     *Holder // the owner's row of the asked kind
		ownMark bool
		blocked bool
		until   int64 // when every blocker is gone, at the latest
		first   int64 // when the first blocker is gone (semaphore)
		live    int   // live permit rows
	)
	block := func(at int64) {
		blocked = true
		until = max(until, at)
		if first == 0 || at < first {
			first = at
		}
	}
	for i := range hs {
		h := &hs[i]
		end := h.DelayUntil
		if h.Kind == KindMark {
			end = h.LockUntil
		}
		if end <= now {
			p.Delete = append(p.Delete, Holder{Owner: h.Owner, Kind: h.Kind})
			continue
		}
		mine := h.Owner == req.Owner
		if mine && h.Kind == int(req.Kind) {
			own = h
			continue
		}
		switch req.Kind {
		case driver.Read:
			if h.Kind == int(driver.Write) || (h.Kind == KindMark && !mine) {
				block(end)
			}
		case driver.Write:
			if h.Kind == KindMark {
				ownMark = ownMark || mine
				continue
			}
			block(end) // any reader or writer, the owner's own read included
		case driver.Permit:
			live++
			if first == 0 || end < first {
				first = end
			}
		}
	}
	if own != nil {
		if own.LockUntil > now {
			// Re-entry; a reader re-enters even behind another owner's
			// mark (it holds already).
			c := *own
			c.Count++
			c.LockUntil, c.DelayUntil = now+ttl, now+ttl+delay
			p.Put = &c
			p.Granted, p.Token, p.Count = true, uint64(c.Fence), c.Count
			return p
		}
		// The owner's own grant lapsed and is inside its lock-delay.
		block(own.DelayUntil)
		live++
	}
	if req.Kind == driver.Permit {
		if live >= req.Permits {
			blocked, until = true, first
		}
	}
	if blocked {
		p.Delete = nil // refusals clean nothing up
		p.SetState = false
		p.Locked = &driver.LockedError{RetryAfter: time.Duration(max(until-now, 0)) * time.Microsecond, Token: uint64(st.Fence)}
		if req.Kind == driver.Write && req.Waiting {
			p.Put = &Holder{Owner: req.Owner, Kind: KindMark, Count: 1, LockUntil: now + ttl, DelayUntil: now + ttl}
		}
		return p
	}
	if ownMark {
		p.Delete = append(p.Delete, Holder{Owner: req.Owner, Kind: KindMark})
	}
	p.Fence = st.Fence + 1
	p.SetState = true
	p.Put = &Holder{Owner: req.Owner, Kind: int(req.Kind), Count: 1, Fence: p.Fence, LockUntil: now + ttl, DelayUntil: now + ttl + delay}
	p.Granted, p.Token, p.Count = true, uint64(p.Fence), 1
	return p
}

// KindTx is one acquire transaction of a lock kind on a driver's database.
// AcquireKind calls Read once and then either Write or Abort once.
type KindTx interface {
	// Read begins the transaction, upserts and locks the (name, grp) row
	// of the _kinds table, and then reads its _holders rows.
	Read(ctx context.Context, name string, grp int) (KindState, []Holder, error)
	// Write makes p's writes and commits.
	Write(ctx context.Context, name string, grp int, p KindPlan) error
	// Abort rolls the transaction back (also after a failed Read).
	Abort()
}

// AcquireKind runs one acquire of req (Kind Read, Write or Permit) in tx:
// it returns the grant, a *driver.LockedError, an error wrapping
// driver.ErrInvalid for a permit count that differs from the stored one,
// or another error (from the statements, led by prefix). The caller gets
// tx from a fresh transaction per call.
func AcquireKind(ctx context.Context, prefix string, tx KindTx, req driver.AcquireRequest) (driver.Grant, error) {
	grp := Group(req.Kind)
	st, hs, err := tx.Read(ctx, req.Name, grp)
	if err != nil {
		tx.Abort()
		return driver.Grant{}, ctxerr.Wrap(ctx, prefix+": acquire "+req.Kind.String(), err)
	}
	p := DecideKind(st, hs, req)
	if p.Err != nil {
		tx.Abort()
		return driver.Grant{}, fmt.Errorf("%s: %w", prefix, p.Err)
	}
	if !p.Writes() {
		tx.Abort()
	} else if err := tx.Write(ctx, req.Name, grp, p); err != nil {
		return driver.Grant{}, ctxerr.Wrap(ctx, prefix+": acquire "+req.Kind.String(), err)
	}
	if !p.Granted {
		return driver.Grant{}, p.Locked
	}
	return driver.Grant{Token: p.Token, Count: p.Count, TTL: req.TTL}, nil
}

// KindRow is a _kinds row listed by Inspect, with the server's clock.
type KindRow struct {
	Name    string
	Grp     int
	Fence   int64
	Permits int
	Now     int64
}

// HolderRow is a _holders row listed by Inspect.
type HolderRow struct {
	Name string
	Grp  int
	Holder
}

// KindInfos builds the Inspect entries of the kinds' locks: one per _kinds
// row, Kind Write for a read/write lock (Owner and Count those of its
// writer if one holds it; Readers its readers), Kind Permit for a
// semaphore (Permits, Holders the permits taken). A holder counts while
// it blocks others: until its lease ends, or, when its lease ran out
// unreleased, until its lock-delay ends (as DecideKind decides). ExpiresIn
// is the time until the last of them stops blocking, lease plus
// lock-delay, as for a mutex row: the time until the lock can be taken
// if no holder renews or releases.
func KindInfos(ks []KindRow, hs []HolderRow) []driver.LockInfo {
	type key struct {
		name string
		grp  int
	}
	idx := map[key]int{}
	out := make([]driver.LockInfo, 0, len(ks))
	nows := make([]int64, 0, len(ks))
	for _, k := range ks {
		li := driver.LockInfo{Name: k.Name, Token: uint64(k.Fence), Waiters: -1, Kind: driver.Write}
		if k.Grp == GroupSem {
			li.Kind, li.Permits = driver.Permit, k.Permits
		}
		idx[key{k.Name, k.Grp}] = len(out)
		out = append(out, li)
		nows = append(nows, k.Now)
	}
	for _, h := range hs {
		i, ok := idx[key{h.Name, h.Grp}]
		if !ok {
			continue
		}
		li, now := &out[i], nows[i]
		left := time.Duration(max(h.LockUntil, h.DelayUntil)-now) * time.Microsecond
		if left <= 0 {
			continue
		}
		switch h.Kind {
		case int(driver.Write):
			li.Owner, li.Count = h.Owner, h.Count
		case int(driver.Read):
			li.Readers++
		case int(driver.Permit):
			li.Holders++
		default: // a waiting writer's mark holds nothing
			continue
		}
		li.ExpiresIn = max(li.ExpiresIn, left)
	}
	return out
}

// MergeInfos merges the kinds' entries into the mutexes', sorted by name
// and then kind.
func MergeInfos(mutexes, kinds []driver.LockInfo) []driver.LockInfo {
	out := append(mutexes, kinds...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// HolderKind returns the kind column of a lease of kind k.
func HolderKind(k driver.Kind) int { return int(k) }

// LeaseKey identifies a renewed lease in a renewal statement's result.
type LeaseKey struct {
	Name, Owner string
	Kind        int // 0 for a mutex
	Fence       int64
}

// KeyOf returns l's LeaseKey.
func KeyOf(l driver.Lease) LeaseKey {
	return LeaseKey{l.Name, l.Owner, int(l.Kind), int64(l.Token)}
}
