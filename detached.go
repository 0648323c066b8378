package dlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// detachedCtx is what context.WithTimeout(context.WithoutCancel(ctx), d)
// gives, made lazily: the timer context behind it (inner) exists only once
// something asks for Done, so that a release or renewal call on a driver
// that never does (memlock, SQLite) costs one allocation rather than four.
// Its parent is never cancelled (its Done is nil), so only its deadline and
// stop end it.
//
// Once inner exists, Value answers from it, so that the context package
// recognises a context derived from x, even through values layered over x (a
// gRPC or etcd client adds its metadata that way), as a child of inner's
// cancelCtx: it registers the child there instead of starting a goroutine
// per derived context to watch Done, which a network driver would otherwise
// pay on every request (TestDriverCtxNoGoroutine).
type detachedCtx struct {
	context.Context // the caller's values; never cancelled
	deadline        time.Time

	mu     sync.Mutex
	err    error              // set when it ends before inner is made
	inner  context.Context    // WithDeadline(Context, deadline), made by the first Done
	cancel context.CancelFunc // inner's
	ready  atomic.Bool        // inner is set (read without mu by Value)
}

// detached returns a context that keeps ctx's values but not its
// cancellation, bounded by ReleaseTimeout; the caller must call its stop.
func (c *Client) detached(ctx context.Context) *detachedCtx {
	if ctx == nil {
		ctx = context.Background()
	}
	if ctx.Done() != nil { // a context that is never cancelled needs no detaching
		ctx = context.WithoutCancel(ctx)
	}
	return &detachedCtx{Context: ctx, deadline: time.Now().Add(c.opts.ReleaseTimeout)}
}

func (x *detachedCtx) Deadline() (time.Time, bool) { return x.deadline, true }

// innerCtx returns inner, making it if need be: ended already if x has.
func (x *detachedCtx) innerCtx() context.Context {
	if x.ready.Load() {
		return x.inner
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.inner == nil {
		x.inner, x.cancel = context.WithDeadline(x.Context, x.deadline)
		if x.err == context.Canceled {
			x.cancel()
		}
		x.ready.Store(true)
	}
	return x.inner
}

func (x *detachedCtx) Done() <-chan struct{} { return x.innerCtx().Done() }

func (x *detachedCtx) Err() error {
	if x.ready.Load() {
		return x.inner.Err()
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.inner != nil {
		return x.inner.Err()
	}
	// time.Until reads only the monotonic clock (the deadline has a
	// monotonic reading), which costs less than time.Now's two clocks.
	if x.err == nil && time.Until(x.deadline) <= 0 {
		x.err = context.DeadlineExceeded
	}
	return x.err
}

// Value answers from inner once it exists (see detachedCtx), else from the
// caller's context: the values are the same but for the context package's
// own key, which finds inner's cancelCtx.
func (x *detachedCtx) Value(key any) any {
	if x.ready.Load() {
		return x.inner.Value(key)
	}
	return x.Context.Value(key)
}

// AfterFunc runs f in a goroutine of its own once x ends (see
// context.AfterFunc); drivers that look for this method hang their contexts
// on x with it rather than start a goroutine to watch Done.
func (x *detachedCtx) AfterFunc(f func()) func() bool {
	return context.AfterFunc(x.innerCtx(), f)
}

// stop ends x (Canceled) if it has not ended, and lets go of its timer.
func (x *detachedCtx) stop() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.inner != nil {
		x.cancel()
	} else if x.err == nil {
		x.err = context.Canceled
	}
}
