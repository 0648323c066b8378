// Package memlock is an in-process dlock backend, for tests and for locks
// shared only between goroutines of one process. Its fault hooks (fail,
// delay or lose the replies of calls, pause or kill a driver, drop a lease,
// skew the server's clock) let the dlock package's own tests play out
// failures that real backends produce, as database/sql's fakedb does.
//
// A Backend plays the server; each Driver plays one client process connected
// to it. Drivers opened with the same mem://NAME URL share one Backend.
//
// Guarantees: mutual exclusion and fencing are exact within the process.
// Expiry uses the Backend's clock (the process's monotonic clock plus the
// skew set by SkewClock). Every wait and reading goes through the time
// package, so inside a testing/synctest bubble a Backend and its Drivers run
// on the bubble's fake clock (create them inside the bubble).
package memlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/standback"
)

var (
	_ driver.Kinder        = (*Driver)(nil)
	_ driver.Withdrawer    = (*Driver)(nil)
	_ driver.MultiAcquirer = (*Driver)(nil)
	_ driver.FenceRaiser   = (*Driver)(nil)
	_ driver.Inspector     = (*Driver)(nil)
	_ driver.Notifier      = (*Driver)(nil)
)

// ErrInjected is returned by calls failed through Driver.FailCalls and
// Driver.Kill.
var ErrInjected = errors.New("memlock: injected failure")

// NewDriver returns a driver connected to b, playing one client process.
func (b *Backend) NewDriver() *Driver {
	return &Driver{b: b, resume: make(chan struct{}), stand: standback.New()}
}

// Driver is a client of a Backend. It implements driver.Driver,
// driver.Notifier, driver.Inspector and every lock kind natively, as the
// reference for other backends: driver.Kinder (read/write locks with writer
// preference, semaphores), driver.Withdrawer, driver.MultiAcquirer and
// driver.FenceRaiser. Its fault hooks are safe to call concurrently with its
// methods.
type Driver struct {
	b *Backend

	mu     sync.Mutex
	delay  time.Duration
	fail   func(op string) error
	after  func(op string) error
	paused bool
	resume chan struct{}
	killed bool
	closed bool
	subs   map[*sub]struct{}
	// stand is the stand-back after a release that woke subscribers (see
	// standback.go).
	stand *standback.StandBack
}

// Backend returns the backend the driver talks to.
func (d *Driver) Backend() *Backend { return d.b }

// DelayCalls makes every later call wait dd before reaching the backend (0
// turns it off), as a slow network would.
func (d *Driver) DelayCalls(dd time.Duration) {
	d.mu.Lock()
	d.delay = dd
	d.mu.Unlock()
}

// FailCalls makes every later call ask f first: a non-nil error fails the
// call without reaching the backend. f receives "acquire" (TryAcquire and
// TryAcquireMulti), "release", "renew", "withdraw", "raise", "inspect" or
// "subscribe". Nil turns it off.
func (d *Driver) FailCalls(f func(op string) error) {
	d.mu.Lock()
	d.fail = f
	d.mu.Unlock()
}

// LoseReplies makes every later call ask f after the call has taken effect
// on the backend: a non-nil error is returned instead of the result, as when
// a reply is lost on the way back. Nil turns it off.
func (d *Driver) LoseReplies(f func(op string) error) {
	d.mu.Lock()
	d.after = f
	d.mu.Unlock()
}

// lost applies LoseReplies after a call took effect.
func (d *Driver) lost(op string) error {
	d.mu.Lock()
	f := d.after
	d.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(op)
}

// Pause blocks every later call (until its context ends) until Resume, as a
// partition or a stopped process would.
func (d *Driver) Pause() {
	d.mu.Lock()
	if !d.paused {
		d.paused = true
		d.resume = make(chan struct{})
	}
	d.mu.Unlock()
}

// Resume lets paused calls proceed.
func (d *Driver) Resume() {
	d.mu.Lock()
	if d.paused {
		d.paused = false
		close(d.resume)
	}
	d.mu.Unlock()
}

// Kill makes every later call fail with ErrInjected, without releasing
// anything: the backend sees a crashed client whose leases expire by TTL.
func (d *Driver) Kill() { d.stop(&d.killed) }

// stop sets *flag and ends the driver's subscriptions.
func (d *Driver) stop(flag *bool) {
	d.mu.Lock()
	*flag = true
	subs := d.subs
	d.subs = nil
	d.mu.Unlock()
	for s := range subs {
		_ = s.Close()
	}
}

// gate applies the fault hooks before a call reaches the backend.
func (d *Driver) gate(ctx context.Context, op string) error {
	d.mu.Lock()
	delay, fail, killed, closed := d.delay, d.fail, d.killed, d.closed
	paused, resume := d.paused, d.resume
	d.mu.Unlock()
	if closed {
		return errors.New("memlock: driver closed")
	}
	if killed {
		return ErrInjected
	}
	if paused {
		select {
		case <-resume:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if fail != nil {
		if err := fail(op); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// TryAcquire implements driver.Driver. Right after this driver's release
// of a mutex that had waiters, a new attempt on it is delayed up to 2ms
// (see standBack).
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	stood := false
	if err := d.stand.Wait(ctx, req, func(released uint64) <-chan struct{} {
		stood = true
		return d.b.nextGrant(req.Name, released)
	}); err != nil {
		if stood {
			d.b.stoodBack(req.Name)
		}
		return driver.Grant{}, err
	}
	if stood {
		defer d.b.stoodBack(req.Name)
	}
	if err := d.gate(ctx, "acquire"); err != nil {
		return driver.Grant{}, err
	}
	g, err := d.b.acquire(req)
	if err == nil && g.Count == 1 {
		d.stand.Granted(req, g.Token)
	} else if errors.Is(err, driver.ErrLocked) {
		d.stand.Refused(req)
	}
	if lerr := d.lost("acquire"); lerr != nil {
		return driver.Grant{}, lerr
	}
	if err == nil {
		g.Key = req.Name // the backend's map is keyed by the name
	}
	return g, err
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if err := d.gate(ctx, "release"); err != nil {
		return 0, err
	}
	n, woke, err := d.b.release(l)
	if woke {
		d.stand.Released(l.Name, l.Token)
	}
	if lerr := d.lost("release"); lerr != nil {
		return 0, lerr
	}
	return n, err
}

// Renew implements driver.Driver: one backend call for the whole batch.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if err := d.gate(ctx, "renew"); err != nil {
		return nil, err
	}
	errs := d.b.renew(ls)
	if lerr := d.lost("renew"); lerr != nil {
		return nil, lerr
	}
	return errs, nil
}

// Inspect implements driver.Inspector.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if err := d.gate(ctx, "inspect"); err != nil {
		return nil, err
	}
	return d.b.inspect(prefix), nil
}

// Subscribe implements driver.Notifier. A mutex release wakes the
// subscriber of the name that subscribed first, and the others only if the
// lock is still free 10ms later; every other change (a read/write lock's or
// semaphore's release, a Drop) wakes them all.
func (d *Driver) Subscribe(ctx context.Context, name string) (driver.Subscription, error) {
	if err := d.gate(ctx, "subscribe"); err != nil {
		return nil, err
	}
	s := &sub{d: d, name: name, c: make(chan struct{}, 1)}
	d.mu.Lock()
	if d.subs == nil {
		d.subs = map[*sub]struct{}{}
	}
	d.subs[s] = struct{}{}
	d.mu.Unlock()
	b := d.b
	b.mu.Lock()
	if b.subs[name] == nil {
		b.subs[name] = map[*sub]struct{}{}
	}
	b.seq++
	s.seq = b.seq
	b.subs[name][s] = struct{}{}
	b.mu.Unlock()
	return s, nil
}

// Close implements driver.Driver. Leases still held are left to expire.
func (d *Driver) Close() error {
	d.stop(&d.closed)
	return nil
}

type sub struct {
	d    *Driver
	name string
	seq  uint64 // in the order of subscription: the oldest is woken first
	c    chan struct{}
	once sync.Once
}

func (s *sub) C() <-chan struct{} { return s.c }

func (s *sub) Close() error {
	s.once.Do(func() {
		b := s.d.b
		b.mu.Lock()
		delete(b.subs[s.name], s)
		if len(b.subs[s.name]) == 0 {
			delete(b.subs, s.name)
		}
		b.mu.Unlock()
		s.d.mu.Lock()
		delete(s.d.subs, s)
		s.d.mu.Unlock()
	})
	return nil
}
