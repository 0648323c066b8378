package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock/dlock/driver"
)

// Hooks observes what a Client's locks do, for metrics, tracing and logs, in
// the manner of pgx's tracers and go-redis's hooks. Set it in Options.Hooks;
// packages dlockprom (Prometheus) and dlockotel (OpenTelemetry) implement
// it, and JoinHooks combines several.
//
// A Client calls its Hooks:
//
//   - OpStart and OpEnd around every operation a caller makes: the acquires
//     (Mutex.Lock and TryLock, RWMutex.RLock, TryRLock, Lock and TryLock,
//     Semaphore.Acquire and TryAcquire, MultiMutex.Lock and TryLock),
//     Lease.Unlock and Lease.Extend. OpEnd is called exactly once for every
//     OpStart, after everything else the operation reports.
//   - Attempt after each attempt an acquire makes on the backend (a waiting
//     Lock makes several: one refused with ErrLocked starts the wait).
//   - LeaseStart once per grant, before the acquire returns it, and LeaseEnd
//     once per grant when it ends: released, lost or closed with its Client.
//     A MultiLease's parts are grants of their own.
//   - Renewal after each automatic renewal of each lease, whatever its
//     outcome: a failure (the backend could not be reached) is reported
//     before the lease is lost, with the time left before its validity
//     deadline.
//
// Every method is called synchronously by the goroutine doing the work (the
// caller of Lock, the Client's renewal goroutine, the goroutine that notices
// a loss), possibly by several goroutines at once: it must be safe for
// concurrent use, return quickly, never block or panic (a panic in the
// renewal goroutine ends the process), and must not call the Client, its
// locks or its leases. The values it is given are copies it may keep.
//
// A Client without Hooks (the default) builds none of these values: an
// unset Hooks costs a nil check per event and no allocation.
//
// Embed NopHooks in an implementation so that it keeps compiling when a later
// version adds a method.
type Hooks interface {
	// OpStart is called when an operation begins. The context it returns
	// (ctx itself, or one derived from it: a tracer puts its span there)
	// is passed to the same operation's Attempt and OpEnd calls and to the
	// backend's calls for it, so that a traced backend client's spans
	// nest under the operation's; it must not be cancelled or carry a
	// deadline of its own.
	OpStart(ctx context.Context, op OpInfo) context.Context
	// Attempt is called after each attempt of an acquire on the backend.
	Attempt(ctx context.Context, op OpInfo, a AttemptInfo)
	// OpEnd is called when the operation returns, with the context
	// OpStart returned.
	OpEnd(ctx context.Context, op OpInfo, r OpResult)
	// LeaseStart is called once for each grant, before the acquire that
	// made it returns.
	LeaseStart(l LeaseInfo)
	// Renewal is called after each automatic renewal attempt of a lease.
	Renewal(l LeaseInfo, r RenewalInfo)
	// LeaseEnd is called once for each grant that LeaseStart reported,
	// when it ends.
	LeaseEnd(l LeaseInfo, e LeaseEndInfo)
}

// Outcome classifies how an operation, an attempt, a renewal or a lease
// ended, the same way for every backend, so that metrics and spans can be
// labelled with it.
type Outcome string

// The outcomes. An error that is several of these is classified by the
// first that applies, in this order: closed, canceled, invalid, locked,
// lost, not_held, error.
const (
	// OutcomeOK: the operation succeeded (an acquire granted, a renewal
	// confirmed the lease, an Unlock or Extend took effect).
	OutcomeOK Outcome = "ok"
	// OutcomeLocked: the lock was held by someone else (ErrLocked).
	OutcomeLocked Outcome = "locked"
	// OutcomeCanceled: the caller's context ended (context.Canceled or
	// context.DeadlineExceeded).
	OutcomeCanceled Outcome = "canceled"
	// OutcomeClosed: the Client was closed (ErrClosed).
	OutcomeClosed Outcome = "closed"
	// OutcomeInvalid: bad input or an option the backend cannot honour
	// (ErrInvalid, ErrUnsupported); nothing reached the backend, or the
	// backend refused it as such.
	OutcomeInvalid Outcome = "invalid"
	// OutcomeNotHeld: the lease had already ended, or the backend says its
	// owner no longer holds the lock (ErrNotHeld).
	OutcomeNotHeld Outcome = "not_held"
	// OutcomeLost: the lease was lost (ErrLeaseLost, or a renewal that
	// found the grant gone).
	OutcomeLost Outcome = "lost"
	// OutcomeReleased: the lease ended by Unlock (LeaseEndInfo only).
	OutcomeReleased Outcome = "released"
	// OutcomeError: a backend failure whose outcome is unknown (an
	// unreachable server, a lost reply, a timeout).
	OutcomeError Outcome = "error"
)

// OutcomeOf classifies err: OutcomeOK for nil, otherwise the first of
// closed, canceled, invalid, locked, lost, not_held that err wraps, and
// OutcomeError for the rest.
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return OutcomeCanceled
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrUnsupported):
		return OutcomeInvalid
	case errors.Is(err, ErrLocked):
		return OutcomeLocked
	case errors.Is(err, ErrLeaseLost):
		return OutcomeLost
	case errors.Is(err, ErrNotHeld), errors.Is(err, driver.ErrSessionLost):
		return OutcomeNotHeld
	}
	return OutcomeError
}

// Causes of a lost lease, in LeaseEndInfo.Cause.
const (
	// CauseDeadline: the lease's local validity deadline passed before a
	// renewal confirmed it (the backend was unreachable, slow or paused,
	// or this process was paused).
	CauseDeadline = "deadline"
	// CauseSession: the session the grant was bound to ended (an etcd
	// lease or a ZooKeeper session expired, a pinned SQL connection died).
	CauseSession = "session"
	// CauseNotHeld: the backend answered that the owner no longer holds the
	// lock (it expired on the server, or was taken or dropped).
	CauseNotHeld = "not_held"
	// CauseOther: any other reason (a grant that arrived too late to use).
	CauseOther = "other"
)

// lossCause names why a lease was lost, from its loss cause.
func lossCause(cause error) string {
	switch {
	case errors.Is(cause, errDeadlinePassed):
		return CauseDeadline
	case errors.Is(cause, driver.ErrSessionLost):
		return CauseSession
	case errors.Is(cause, ErrNotHeld):
		return CauseNotHeld
	}
	return CauseOther
}

// OpInfo describes an operation, as OpStart sees it.
type OpInfo struct {
	// Op is the operation: "lock", "trylock" (Mutex, the write side of an
	// RWMutex, MultiMutex), "rlock", "tryrlock" (the read side of an
	// RWMutex), "acquire", "tryacquire" (Semaphore), "unlock" or
	// "extend".
	Op string
	// Backend names the Client's backend (see Client.Backend).
	Backend string
	// Name is the lock's name. For a MultiMutex it lists its names,
	// sorted, separated by commas, and Names holds them.
	Name string
	// Names is, for a MultiMutex, its names in the order they are taken;
	// nil otherwise.
	Names []string
	// Kind is the lock's sort: "mutex", "read", "write", "permit" (as
	// Lease.Kind), or "multi" for a MultiMutex.
	Kind string
	// Token is, for Unlock and Extend, the lease's fencing token; zero
	// for an acquire.
	Token uint64
	// Start is when the operation began.
	Start time.Time
}

// IsAcquire reports whether the operation takes a lock (as opposed to
// "unlock" and "extend").
func (o OpInfo) IsAcquire() bool { return o.Op != "unlock" && o.Op != "extend" }

// Waits reports whether the operation is an acquire that waits while the
// lock is held (Lock, RLock, Acquire), as opposed to one that fails at once
// (TryLock, TryRLock, TryAcquire).
func (o OpInfo) Waits() bool { return o.IsAcquire() && !strings.HasPrefix(o.Op, "try") }

// AttemptInfo describes one attempt of an acquire on the backend.
type AttemptInfo struct {
	// N counts the operation's attempts, from 1.
	N int
	// Outcome is OutcomeOK when the attempt was granted, OutcomeLocked
	// when the lock was held (a waiting acquire then waits), and
	// otherwise as OutcomeOf(Err).
	Outcome Outcome
	// Err is the attempt's error, nil when granted.
	Err error
	// Latency is how long the backend call took. On a backend that queues
	// waiters (etcd, ZooKeeper) a waiting acquire's attempt includes its
	// wait in the queue.
	Latency time.Duration
	// HolderToken is, when the lock was held, the holder's fencing token
	// if the backend told it (zero if not).
	HolderToken uint64
	// RetryAfter is, when the lock was held, how long until it can be
	// taken at the latest if nobody releases it (the holder's remaining
	// TTL plus lock-delay), if the backend told it (zero if not).
	RetryAfter time.Duration
}

// OpResult describes how an operation ended, as OpEnd sees it.
type OpResult struct {
	// Outcome classifies Err (OutcomeOf).
	Outcome Outcome
	// Err is the error the operation returned, nil on success.
	Err error
	// Token is, for an acquire that was granted, the lease's fencing
	// token (a MultiLease's largest); for Unlock and Extend the lease's.
	Token uint64
	// Duration is how long the operation took: for an acquire, its wait.
	Duration time.Duration
	// Attempts is how many attempts an acquire made on the backend.
	Attempts int
	// Contended reports whether an attempt of the acquire found the lock
	// held (ErrLocked): a TryLock refused, or a Lock that had to wait. A
	// waiting acquire on a backend that queues waiters (etcd, ZooKeeper)
	// waits inside one attempt and is never reported as contended.
	Contended bool
}

// LeaseInfo describes a grant, as LeaseStart, Renewal and LeaseEnd see it.
type LeaseInfo struct {
	// Backend names the Client's backend (see Client.Backend).
	Backend string
	// Name is the lock's name.
	Name string
	// Kind is what the lease holds: "mutex", "read", "write" or "permit".
	Kind string
	// Token is the lease's fencing token.
	Token uint64
	// TTL is the lease's time to live on the backend.
	TTL time.Duration
}

// RenewalInfo describes one automatic renewal attempt of a lease.
type RenewalInfo struct {
	// Outcome is OutcomeOK when the renewal confirmed the lease,
	// OutcomeError when its fate is unknown (it is retried until the
	// validity deadline), and OutcomeLost when the backend says the grant is
	// gone (LeaseEnd follows).
	Outcome Outcome
	// Err is the renewal's error, nil when confirmed.
	Err error
	// Latency is how long the backend's renewal call took. Leases renewed
	// in one batch share one call.
	Latency time.Duration
	// Failures counts the renewals of this lease that failed in a row,
	// this one included: zero after a confirmation.
	Failures int
	// ValidFor is how long the lease is known to be valid, from now (after
	// this renewal), by the local monotonic clock: the time left before it
	// is lost unless a renewal gets through.
	ValidFor time.Duration
	// Batch is how many leases the backend call renewed, and Index this
	// lease's place among them (from 0), so that per-call figures such as
	// Latency can be counted once per call (Index 0).
	Batch, Index int
}

// LeaseEndInfo describes how a grant ended.
type LeaseEndInfo struct {
	// Outcome is OutcomeReleased (Unlock; also when the release's outcome
	// was unknown and it is retried in the background), OutcomeLost or
	// OutcomeClosed (the Client was closed while it was held).
	Outcome Outcome
	// Cause is, for a lost lease, why: CauseDeadline, CauseSession,
	// CauseNotHeld or CauseOther; empty otherwise.
	Cause string
	// Err is the lease's Err.
	Err error
	// Held is how long the lease was held, from its grant.
	Held time.Duration
}

// NopHooks implements Hooks with methods that do nothing. Embed it in a
// Hooks implementation to implement only some methods and to keep compiling
// when a later version adds one.
type NopHooks struct{}

var _ Hooks = NopHooks{}

// OpStart returns ctx.
func (NopHooks) OpStart(ctx context.Context, _ OpInfo) context.Context { return ctx }

// Attempt does nothing.
func (NopHooks) Attempt(context.Context, OpInfo, AttemptInfo) {}

// OpEnd does nothing.
func (NopHooks) OpEnd(context.Context, OpInfo, OpResult) {}

// LeaseStart does nothing.
func (NopHooks) LeaseStart(LeaseInfo) {}

// Renewal does nothing.
func (NopHooks) Renewal(LeaseInfo, RenewalInfo) {}

// LeaseEnd does nothing.
func (NopHooks) LeaseEnd(LeaseInfo, LeaseEndInfo) {}

// JoinHooks returns Hooks that call each of hs in turn (nil entries are
// skipped): OpStart in order, each given the context the one before
// returned; OpEnd in reverse order, so that spans end innermost first; the
// rest in order. It returns nil when hs holds no Hooks, and the one Hooks
// when it holds one.
func JoinHooks(hs ...Hooks) Hooks {
	var j joinedHooks
	for _, h := range hs {
		switch h := h.(type) {
		case nil:
		case joinedHooks:
			j = append(j, h...)
		default:
			j = append(j, h)
		}
	}
	switch len(j) {
	case 0:
		return nil
	case 1:
		return j[0]
	}
	return j
}

type joinedHooks []Hooks

func (j joinedHooks) OpStart(ctx context.Context, op OpInfo) context.Context {
	for _, h := range j {
		ctx = h.OpStart(ctx, op)
	}
	return ctx
}

func (j joinedHooks) Attempt(ctx context.Context, op OpInfo, a AttemptInfo) {
	for _, h := range j {
		h.Attempt(ctx, op, a)
	}
}

func (j joinedHooks) OpEnd(ctx context.Context, op OpInfo, r OpResult) {
	for i := len(j) - 1; i >= 0; i-- {
		j[i].OpEnd(ctx, op, r)
	}
}

func (j joinedHooks) LeaseStart(l LeaseInfo) {
	for _, h := range j {
		h.LeaseStart(l)
	}
}

func (j joinedHooks) Renewal(l LeaseInfo, r RenewalInfo) {
	for _, h := range j {
		h.Renewal(l, r)
	}
}

func (j joinedHooks) LeaseEnd(l LeaseInfo, e LeaseEndInfo) {
	for _, h := range j {
		h.LeaseEnd(l, e)
	}
}

// backendOf names the backend of d for Hooks, logs and Client.Backend: the
// URL scheme of the dlock drivers ("mem", "sqlite", "redis", "redlock",
// "etcd", "zk", "postgres", "mysql", "quorum"), and for other drivers the
// name of the driver's package with a "lock" suffix cut.
func backendOf(d driver.Driver) string {
	pkg, _, _ := strings.Cut(strings.TrimLeft(fmt.Sprintf("%T", d), "*"), ".")
	switch pkg {
	case "memlock":
		return "mem"
	case "pglock":
		return "postgres"
	case "redlock", "quorum":
		return pkg
	}
	if s, ok := strings.CutSuffix(pkg, "lock"); ok && s != "" {
		return s
	}
	return pkg
}

// opTrace follows one operation for the Client's Hooks; a nil *opTrace
// (no Hooks) does nothing, so that the operations cost nothing extra then.
type opTrace struct {
	h         Hooks
	ctx       context.Context
	info      OpInfo
	attempts  int
	contended bool
}

// startOp begins an operation for the hooks: nil and ctx unchanged when the
// Client has none.
// info gives the operation's Op, Name, Names, Kind and Token; startOp
// adds Backend and Start.
func (c *Client) startOp(ctx context.Context, info OpInfo) (*opTrace, context.Context) {
	h := c.hooks
	if h == nil {
		return nil, ctx
	}
	if ctx == nil {
		ctx = context.Background()
	}
	info.Backend, info.Start = c.backend, time.Now()
	t := &opTrace{h: h, info: info}
	t.ctx = h.OpStart(ctx, t.info)
	if t.ctx == nil {
		t.ctx = ctx
	}
	return t, t.ctx
}

// attempt reports one attempt of an acquire.
func (t *opTrace) attempt(err error, latency time.Duration) {
	if t == nil {
		return
	}
	t.attempts++
	a := AttemptInfo{N: t.attempts, Outcome: OutcomeOf(err), Err: err, Latency: latency}
	if a.Outcome == OutcomeLocked {
		t.contended = true
		var le *driver.LockedError
		if errors.As(err, &le) {
			a.HolderToken, a.RetryAfter = le.Token, le.RetryAfter
		}
	}
	t.h.Attempt(t.ctx, t.info, a)
}

// end reports the operation's end.
func (t *opTrace) end(err error, token uint64) {
	if t == nil {
		return
	}
	if err != nil && errors.Is(err, ErrLocked) {
		t.contended = true
	}
	if token == 0 {
		token = t.info.Token
	}
	t.h.OpEnd(t.ctx, t.info, OpResult{Outcome: OutcomeOf(err), Err: err, Token: token,
		Duration: time.Since(t.info.Start), Attempts: t.attempts, Contended: t.contended})
}

// leaseInfo describes l for the hooks (l.mu need not be held: the fields
// read do not change, except ttl, which is read under l.mu by the callers
// that hold it and passed in).
func (c *Client) leaseInfo(l *Lease, ttl time.Duration) LeaseInfo {
	return LeaseInfo{Backend: c.backend, Name: l.name, Kind: l.kind.String(), Token: l.token, TTL: ttl}
}

// leaseEnded tells the hooks that l, which LeaseStart reported at
// grantedAt, ended with err.
func (c *Client) leaseEnded(l *Lease, ttl time.Duration, grantedAt int64, err error) {
	e := LeaseEndInfo{Outcome: OutcomeReleased, Err: err, Held: time.Duration(c.now() - grantedAt)}
	var le *lostError
	switch {
	case errors.As(err, &le):
		e.Outcome, e.Cause = OutcomeLost, lossCause(le.cause)
	case errors.Is(err, ErrClosed):
		e.Outcome = OutcomeClosed
	}
	c.hooks.LeaseEnd(c.leaseInfo(l, ttl), e)
}
