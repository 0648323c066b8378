// Package memlock is an in-process dlock backend, for tests and for locks
// shared only between goroutines of one process. Its fault hooks (drop or
// delay calls, pause a driver, force-expire or drop a lease, skew the
// server's clock) let the dlock package's own tests play out failures that
// real backends produce, as database/sql's fakedb does.
//
// A Backend plays the server; each Driver plays one client process connected
// to it. Drivers opened with the same mem://NAME URL share one Backend.
//
// Guarantees: mutual exclusion and fencing are exact within the process.
// Expiry uses the Backend's clock (the process's monotonic clock plus the
// skew set by SkewClock).
package memlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

func init() {
	dlock.Register("mem", func(ctx context.Context, u *url.URL) (driver.Driver, error) {
		if len(u.Query()) > 0 {
			for k := range u.Query() {
				return nil, dlock.BadURL("memlock: unknown URL parameter %q", k)
			}
		}
		name := u.Host + u.Path
		namedMu.Lock()
		defer namedMu.Unlock()
		b, ok := named[name]
		if !ok {
			b = NewBackend()
			named[name] = b
		}
		return b.NewDriver(), nil
	})
}

var (
	namedMu sync.Mutex
	named   = map[string]*Backend{}
)

// ErrInjected is returned by calls failed through Driver.FailCalls and
// Driver.Kill.
var ErrInjected = errors.New("memlock: injected failure")

// Backend is the in-memory "server". It is safe for concurrent use.
type Backend struct {
	mu    sync.Mutex
	locks map[string]*entry
	skew  time.Duration
	subs  map[string]map[*sub]struct{}
	calls map[string]int // count of calls by operation, for tests
}

type entry struct {
	owner      string
	count      int
	fence      uint64
	expires    time.Time // server time; zero when free
	delayUntil time.Time // lock-delay deadline after an expiry
	delay      time.Duration
}

// NewBackend returns an empty backend.
func NewBackend() *Backend {
	return &Backend{locks: map[string]*entry{}, subs: map[string]map[*sub]struct{}{}, calls: map[string]int{}}
}

// Named returns the backend that mem://name URLs open, creating it if needed.
func Named(name string) *Backend {
	namedMu.Lock()
	defer namedMu.Unlock()
	b, ok := named[name]
	if !ok {
		b = NewBackend()
		named[name] = b
	}
	return b
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

// Expire ends the current grant on name as if its TTL ran out now: lock-delay
// applies. It reports whether there was a grant.
func (b *Backend) Expire(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.locks[name]
	if e == nil || e.count == 0 {
		return false
	}
	now := b.now()
	e.count, e.owner = 0, ""
	e.expires = time.Time{}
	e.delayUntil = now.Add(e.delay)
	return true
}

// Drop forgets the current grant on name with no lock-delay, as a server
// that lost it would. The fencing counter survives.
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

func (b *Backend) notifyLocked(name string) {
	for s := range b.subs[name] {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
}

// NewDriver returns a driver connected to b, playing one client process.
func (b *Backend) NewDriver() *Driver {
	return &Driver{b: b, resume: make(chan struct{})}
}

// Driver is a client of a Backend. It implements driver.Driver,
// driver.Notifier and driver.Inspector. Its fault hooks are safe to call
// concurrently with its methods.
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
// call without reaching the backend. f receives "acquire", "release" or
// "renew". Nil turns it off.
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

// TryAcquire implements driver.Driver.
func (d *Driver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := d.gate(ctx, "acquire"); err != nil {
		return driver.Grant{}, err
	}
	g, err := d.tryAcquire(req)
	if lerr := d.lost("acquire"); lerr != nil {
		return driver.Grant{}, lerr
	}
	return g, err
}

func (d *Driver) tryAcquire(req driver.AcquireRequest) (driver.Grant, error) {
	b := d.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["acquire"]++
	now := b.now()
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
	e.fence++
	e.owner, e.count = req.Owner, 1
	e.expires = now.Add(req.TTL)
	e.delay = req.LockDelay
	e.delayUntil = time.Time{}
	return driver.Grant{Token: e.fence, Count: 1}, nil
}

// Release implements driver.Driver.
func (d *Driver) Release(ctx context.Context, l driver.Lease) (int, error) {
	if err := d.gate(ctx, "release"); err != nil {
		return 0, err
	}
	n, err := d.release(l)
	if lerr := d.lost("release"); lerr != nil {
		return 0, lerr
	}
	return n, err
}

func (d *Driver) release(l driver.Lease) (int, error) {
	b := d.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["release"]++
	e := b.locks[l.Name]
	if e == nil || !b.heldLocked(e, b.now()) || e.owner != l.Owner || (l.Token != 0 && e.fence != l.Token) {
		return 0, fmt.Errorf("memlock: release %q: %w", l.Name, driver.ErrNotHeld)
	}
	e.count--
	if e.count > 0 {
		return e.count, nil
	}
	e.owner, e.expires, e.delayUntil = "", time.Time{}, time.Time{}
	b.notifyLocked(l.Name)
	return 0, nil
}

// Renew implements driver.Driver: one backend call for the whole batch.
func (d *Driver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	if err := d.gate(ctx, "renew"); err != nil {
		return nil, err
	}
	errs := d.renew(ls)
	if lerr := d.lost("renew"); lerr != nil {
		return nil, lerr
	}
	return errs, nil
}

func (d *Driver) renew(ls []driver.Lease) []error {
	b := d.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls["renew"]++
	now := b.now()
	errs := make([]error, len(ls))
	for i, l := range ls {
		e := b.locks[l.Name]
		if e == nil || !b.heldLocked(e, now) || e.owner != l.Owner || e.fence != l.Token {
			errs[i] = fmt.Errorf("memlock: renew %q: %w", l.Name, driver.ErrNotHeld)
			continue
		}
		e.expires = now.Add(l.TTL)
	}
	return errs
}

// Inspect implements driver.Inspector.
func (d *Driver) Inspect(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if err := d.gate(ctx, "inspect"); err != nil {
		return nil, err
	}
	b := d.b
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
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Subscribe implements driver.Notifier.
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
