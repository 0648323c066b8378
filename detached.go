package dlock

import (
	"context"
	"sync"
	"time"
)

// detachedCtx is what context.WithTimeout(context.WithoutCancel(ctx), d)
// gives, made lazily: its timer and Done channel exist only once something
// asks for Done, so that a release or renewal call on a driver that never
// does (memlock, SQLite) costs one allocation rather than four. Its parent is
// never cancelled (its Done is nil), so only its deadline and stop end it.
type detachedCtx struct {
	context.Context // the caller's values; never cancelled
	deadline        time.Time

	mu     sync.Mutex
	err    error         // set when it ends: DeadlineExceeded, or Canceled by stop
	done   chan struct{} // made by the first Done
	timer  *time.Timer   // ends it at the deadline, once done is made
	afters []*detachedAfter
}

// detachedAfter is a function AfterFunc arranged to run when the context
// ends.
type detachedAfter struct {
	f       func()
	stopped bool
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

func (x *detachedCtx) Done() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.done == nil {
		x.done = make(chan struct{})
		switch d := time.Until(x.deadline); {
		case x.err != nil:
			close(x.done)
		case d <= 0:
			x.endLocked(context.DeadlineExceeded)
		default:
			x.timer = time.AfterFunc(d, x.expire)
		}
	}
	return x.done
}

func (x *detachedCtx) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err == nil && !time.Now().Before(x.deadline) {
		x.endLocked(context.DeadlineExceeded)
	}
	return x.err
}

// AfterFunc lets the context package hang contexts derived from x on it (a
// driver's WithCancel or WithTimeout) rather than start a goroutine per
// derived context to watch Done; f runs in a goroutine of its own once x
// ends.
func (x *detachedCtx) AfterFunc(f func()) func() bool {
	x.Done() // arms the deadline
	x.mu.Lock()
	defer x.mu.Unlock()
	a := &detachedAfter{f: f}
	if x.err != nil {
		go f()
		return func() bool { return false }
	}
	x.afters = append(x.afters, a)
	return func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		if a.stopped || x.err != nil {
			return false
		}
		a.stopped = true
		return true
	}
}

// expire ends x at its deadline.
func (x *detachedCtx) expire() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err == nil {
		x.endLocked(context.DeadlineExceeded)
	}
}

// stop ends x (Canceled) if it has not ended, and lets go of its timer.
func (x *detachedCtx) stop() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.err == nil {
		x.endLocked(context.Canceled)
	}
}

// endLocked ends x with err (x.mu held, x not ended).
func (x *detachedCtx) endLocked(err error) {
	x.err = err
	if x.done != nil {
		close(x.done)
	}
	if x.timer != nil {
		x.timer.Stop()
	}
	for _, a := range x.afters {
		if !a.stopped {
			go a.f()
		}
	}
	x.afters = nil
}
