package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
)

// MultiMutex takes several Mutexes at once: every name or none. Its parts
// are the Mutexes of those names, so a MultiMutex over {a, b} excludes
// NewMutex("a") and every other MultiMutex that lists a or b.
//
// Names are taken in one canonical order (sorted bytewise), whatever order
// they were given in, so two MultiMutexes over overlapping sets never
// deadlock: whoever holds the smaller shared name first goes on to the
// next, and nobody ever waits for a name while holding a larger one. A
// backend that can take several locks in one atomic round trip
// (driver.MultiAcquirer: one script, one transaction) does so; elsewhere
// the names are taken one by one in that order.
//
// TryLock leaves nothing held when one name is busy. Lock waits for each
// name in turn, holding the names before it, as Mutex.Lock waits (and
// rides out backend errors the same way); when its context ends it
// releases what it took.
//
// A MultiMutex is safe for concurrent use and may be used for many grants.
type MultiMutex struct {
	c     *Client
	names []string // canonical order
	parts []*Mutex
	err   error // construction error, reported on use
}

// NewMultiMutex returns the lock over names: at least one, each a valid
// lock name, none listed twice (a duplicate is refused, wrapping ErrInvalid,
// rather than silently merged). opts may be nil for the client's defaults;
// they apply to every part. Invalid input is reported by Lock and TryLock.
func (c *Client) NewMultiMutex(names []string, opts *MutexOptions) *MultiMutex {
	mm := &MultiMutex{c: c, names: slices.Clone(names)}
	slices.Sort(mm.names)
	if len(names) == 0 {
		mm.err = invalid("names", "must list at least one name")
		return mm
	}
	for i := 1; i < len(mm.names); i++ {
		if mm.names[i] == mm.names[i-1] {
			mm.err = invalid("names", "lists %q more than once", mm.names[i])
			return mm
		}
	}
	for _, n := range mm.names {
		m := c.NewMutex(n, opts)
		if m.err != nil {
			mm.err = m.err
			return mm
		}
		mm.parts = append(mm.parts, m)
	}
	return mm
}

// Names returns the names in the order they are taken (sorted).
func (mm *MultiMutex) Names() []string { return slices.Clone(mm.names) }

// Lock takes every name, waiting for each in canonical order. It returns
// when all are held, or, having released what it took, when ctx ends, the
// client closes (ErrClosed) or an error that is not retried occurs.
func (mm *MultiMutex) Lock(ctx context.Context) (*MultiLease, error) { return mm.acquire(ctx, true) }

// TryLock makes one attempt to take every name. If any is held it returns
// an error wrapping ErrLocked that names it, and holds none of them.
func (mm *MultiMutex) TryLock(ctx context.Context) (*MultiLease, error) {
	return mm.acquire(ctx, false)
}

// errNoMulti makes acquire take the names one by one.
var errNoMulti = errors.New("no atomic multi-acquire for this set")

func (mm *MultiMutex) acquire(ctx context.Context, wait bool) (*MultiLease, error) {
	if mm.c.hooks == nil {
		return mm.acquireOp(ctx, ctx, wait, nil)
	}
	op := "trylock"
	if wait {
		op = "lock"
	}
	t, tctx := mm.c.startOp(ctx, OpInfo{Op: op, Name: strings.Join(mm.names, ","), Names: mm.names, Kind: "multi"})
	if ctx == nil {
		tctx = nil
	}
	ml, err := mm.acquireOp(ctx, tctx, wait, t)
	var token uint64
	if ml != nil {
		token = ml.Token()
	}
	t.end(err, token)
	return ml, err
}

// acquireOp is acquire's work: ctx is the caller's context, which the
// leases keep the values of, and tctx the operation's (ctx, or what the
// hooks derived from it, followed by t; nil: no hooks), for the backend's
// calls.
func (mm *MultiMutex) acquireOp(ctx, tctx context.Context, wait bool, t *opTrace) (*MultiLease, error) {
	if mm.err != nil {
		return nil, mm.err
	}
	if ctx == nil || tctx == nil {
		return nil, invalid("ctx", "must not be nil")
	}
	if mm.c.isClosed() {
		return nil, ErrClosed
	}
	if ma, ok := mm.c.d.(driver.MultiAcquirer); ok && len(mm.parts) > 1 {
		ml, err := mm.tryMulti(ctx, tctx, ma, wait, t)
		switch {
		case err == nil:
			return ml, nil
		case errors.Is(err, errNoMulti):
		case errors.Is(err, ErrLocked) && wait:
			// Wait for the names one by one: the atomic call cannot wait.
		default:
			return nil, err
		}
	}
	return mm.oneByOne(ctx, tctx, wait)
}

// label names the set in errors.
func (mm *MultiMutex) label() string {
	q := make([]string, len(mm.names))
	for i, n := range mm.names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return "[" + strings.Join(q, " ") + "]"
}

// tryMulti makes one atomic attempt through the driver, on tctx (see
// acquireOp).
func (mm *MultiMutex) tryMulti(ctx, tctx context.Context, ma driver.MultiAcquirer, wait bool, t *opTrace) (*MultiLease, error) {
	c := mm.c
	op := "trylock"
	if wait {
		op = "lock"
	}
	r := *mm.parts[0].r
	explicitOwner := r.owner != ""
	if !explicitOwner {
		r.owner, r.generated = newOwner(), true
	}
	reqs := make([]driver.AcquireRequest, len(mm.parts))
	for i, p := range mm.parts {
		reqs[i] = driver.AcquireRequest{Name: p.name, Owner: r.owner, TTL: p.r.ttl, LockDelay: p.r.delay}
	}
	sent := time.Now()
	gs, err := ma.TryAcquireMulti(tctx, reqs)
	if err == nil && len(gs) != len(reqs) {
		err = fmt.Errorf("driver returned %d grants for %d names", len(gs), len(reqs))
	}
	if err == nil {
		for _, g := range gs {
			if g.Token == 0 {
				err = errZeroToken
			}
		}
	}
	if t != nil {
		t.attempt(err, time.Since(sent))
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrUnsupported):
			return nil, errNoMulti
		case errors.Is(err, ErrLocked):
			return nil, fmt.Errorf("dlock: %s %s: %w", op, mm.label(), err)
		case errors.Is(err, ErrInvalid):
		case !explicitOwner:
			// The outcome is unknown: any name may be held under our fresh
			// owner. Release each, and keep trying in the background.
			for _, q := range reqs {
				dl := driver.Lease{Name: q.Name, Owner: q.Owner, TTL: q.TTL, LockDelay: q.LockDelay}
				rctx := c.detached(ctx)
				_, rerr := c.d.Release(rctx, dl)
				rctx.stop()
				if rerr != nil && !errors.Is(rerr, ErrNotHeld) {
					c.releaseUnknown("clean-up", dl, nil, true, rerr)
				}
			}
		}
		return nil, c.wrap(op, mm.label(), ctx, err)
	}
	leases := make([]*Lease, 0, len(gs))
	var first error
	for i, g := range gs {
		l, err := mm.parts[i].finish(ctx, op, r, g, sent, ctx)
		if err != nil {
			first = cmpOr(first, err)
			continue
		}
		leases = append(leases, l)
	}
	if first != nil {
		unlockAll(leases)
		return nil, first
	}
	return newMultiLease(ctx, leases), nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// oneByOne takes the names in canonical order through the Mutex machinery,
// on tctx (see acquireOp).
func (mm *MultiMutex) oneByOne(ctx, tctx context.Context, wait bool) (*MultiLease, error) {
	for {
		leases := make([]*Lease, 0, len(mm.parts))
		for _, p := range mm.parts {
			l, err := p.acquireIn(tctx, ctx, wait)
			if err != nil {
				unlockAll(leases)
				return nil, err
			}
			leases = append(leases, l)
		}
		var lost error
		for _, l := range leases {
			if err := l.Err(); err != nil {
				lost = fmt.Errorf("dlock: lock %q, part of %s, ended while the later names were taken: %w", l.name, mm.label(), err)
				break
			}
		}
		if lost == nil {
			return newMultiLease(ctx, leases), nil
		}
		unlockAll(leases)
		if !wait || ctx.Err() != nil {
			return nil, lost
		}
		mm.c.log.Warn("dlock: a part of a multi-lock ended while waiting for the others; taking them again", "backend", mm.c.backend, "err", lost)
	}
}

// unlockAll releases leases, last first, on a best-effort basis.
func unlockAll(leases []*Lease) {
	for i := len(leases) - 1; i >= 0; i-- {
		_ = leases[i].Unlock(context.Background())
	}
}

// MultiLease is one grant of a MultiMutex: a Lease per name. It has the
// Lease's methods and guarantees, for all parts at once: every part renews
// itself, and the MultiLease is lost as soon as any part is lost (Done
// closes, Context is cancelled, Err wraps that part's cause); the parts
// still held are then released. Unlock releases every part. A MultiLease is
// safe for concurrent use.
type MultiLease struct {
	parts  []*Lease // canonical order
	stops  []func() bool
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}

	mu        sync.Mutex
	err       error
	releasing bool
}

func newMultiLease(parent context.Context, parts []*Lease) *MultiLease {
	ml := &MultiLease{parts: parts, done: make(chan struct{})}
	ml.ctx, ml.cancel = context.WithCancelCause(detachedValues(valuesOf(parent)))
	ml.mu.Lock()
	defer ml.mu.Unlock()
	for _, p := range parts {
		ml.stops = append(ml.stops, context.AfterFunc(p.Context(), func() { ml.partEnded(p) }))
	}
	return ml
}

// partEnded ends the MultiLease when one of its parts ended other than by
// the MultiLease's own Unlock, and releases the parts still held.
func (ml *MultiLease) partEnded(p *Lease) {
	ml.mu.Lock()
	if ml.err != nil || ml.releasing {
		ml.mu.Unlock()
		return
	}
	err := p.Err()
	if err == nil {
		err = &lostError{cause: fmt.Errorf("part %q ended", p.name)}
	} else if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrLeaseLost) {
		err = &lostError{cause: fmt.Errorf("part %q: %w", p.name, err)}
	}
	ml.err = err
	ml.mu.Unlock()
	// Cancel before closing done, as a Lease does: a caller woken by Done
	// reads the cause from Context at once.
	ml.cancel(err)
	close(ml.done)
	unlockAll(ml.parts)
}

// Names returns the names held, in canonical (sorted) order.
func (ml *MultiLease) Names() []string {
	out := make([]string, len(ml.parts))
	for i, p := range ml.parts {
		out[i] = p.name
	}
	return out
}

// Tokens returns each name's fencing token, in the order of Names.
func (ml *MultiLease) Tokens() []uint64 {
	out := make([]uint64, len(ml.parts))
	for i, p := range ml.parts {
		out[i] = p.token
	}
	return out
}

// Token returns the largest of the parts' fencing tokens. Each name keeps
// its own counter, so fence a resource guarded by one name with that name's
// token (Tokens); Token is for logs and for resources that track one
// MultiMutex set as a whole.
func (ml *MultiLease) Token() uint64 {
	var t uint64
	for _, p := range ml.parts {
		t = max(t, p.token)
	}
	return t
}

// Done returns a channel closed when the MultiLease ends: released, any part
// lost, or its client closed.
func (ml *MultiLease) Done() <-chan struct{} { return ml.done }

// Err returns nil while every part is held; afterwards an error wrapping
// ErrReleased, ErrLeaseLost (with the lost part's cause) or ErrClosed.
func (ml *MultiLease) Err() error {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return ml.err
}

// Context returns a context cancelled when Done closes, carrying the values
// of the context Lock was called with; context.Cause reports Err.
func (ml *MultiLease) Context() context.Context { return ml.ctx }

// ValidFor returns how long every part is known to be valid from now (the
// least of the parts'), zero once the MultiLease ended.
func (ml *MultiLease) ValidFor() time.Duration {
	if ml.Err() != nil {
		return 0
	}
	v := time.Duration(-1)
	for _, p := range ml.parts {
		if d := p.ValidFor(); v < 0 || d < v {
			v = d
		}
	}
	return max(v, 0)
}

// Extend sets every part's TTL to ttl from now, as Lease.Extend does, and
// returns the first error. A part the server no longer has ends the
// MultiLease (lost).
func (ml *MultiLease) Extend(ctx context.Context, ttl time.Duration) error {
	if ml.Err() != nil {
		return fmt.Errorf("dlock: extend %q: %w", ml.Names(), ErrNotHeld)
	}
	var first error
	for _, p := range ml.parts {
		if err := p.Extend(ctx, ttl); err != nil {
			first = cmpOr(first, err)
		}
	}
	return first
}

// Unlock releases every part, as Lease.Unlock does (owner-only, on a
// context detached from ctx's cancellation, retried in the background when
// the outcome is unknown). It returns an error wrapping ErrNotHeld if the
// MultiLease had already ended, and otherwise the first part's error.
func (ml *MultiLease) Unlock(ctx context.Context) error {
	ml.mu.Lock()
	if ml.err != nil || ml.releasing {
		ml.mu.Unlock()
		return fmt.Errorf("dlock: unlock %q: %w", ml.Names(), ErrNotHeld)
	}
	ml.releasing = true
	ml.mu.Unlock()
	for _, stop := range ml.stops {
		stop()
	}
	var first, lost error
	for i := len(ml.parts) - 1; i >= 0; i-- {
		p := ml.parts[i]
		if err := p.Unlock(ctx); err != nil {
			first = cmpOr(first, err)
			if errors.Is(err, ErrNotHeld) && lost == nil {
				lost = p.Err()
			}
		}
	}
	end := error(ErrReleased)
	switch {
	case lost != nil:
		end = lost
	case first != nil:
		end = fmt.Errorf("%w (a part's release failed: %v)", ErrReleased, first)
	}
	ml.mu.Lock()
	ml.err = end
	ml.mu.Unlock()
	// Cancel before closing done, as a Lease does: a caller woken by Done
	// reads the cause from Context at once.
	ml.cancel(end)
	close(ml.done)
	return first
}
