package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/memlock"
)

// logRecorder is a slog handler that keeps the messages logged at Warn and
// above.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	r.msgs = append(r.msgs, b.String())
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// count returns how many recorded messages contain s.
func (r *logRecorder) count(s string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// cut is a switch for a driver's FailCalls hook: while on, calls of the
// given operation fail before reaching the backend, as when the connection
// is cut.
type cut struct {
	on    atomic.Bool
	op    string
	err   error
	calls atomic.Int32 // calls of op that were failed
}

func newCut(d *memlock.Driver, op string) *cut {
	c := &cut{op: op, err: errors.New("connection closed")}
	c.on.Store(true)
	d.FailCalls(func(o string) error {
		if o == c.op && c.on.Load() {
			c.calls.Add(1)
			return c.err
		}
		return nil
	})
	return c
}

// sessionDriver binds every grant to one session channel, as the etcd and
// ZooKeeper drivers do, so tests can end the session.
type sessionDriver struct {
	*memlock.Driver
	lost  chan struct{}
	cause error
}

func newSessionDriver(cause error) *sessionDriver {
	return &sessionDriver{Driver: memlock.NewBackend().NewDriver(), lost: make(chan struct{}), cause: cause}
}

func (d *sessionDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, req)
	if err == nil {
		g.Lost = d.lost
		if d.cause != nil {
			g.Cause = func() error { return d.cause }
		}
	}
	return g, err
}

func pending(c *dlock.Client) func() bool {
	return func() bool { return dlock.PendingReleases(c) == 0 }
}

// free reports whether nobody holds name on b.
func free(b *memlock.Backend, name string) func() bool {
	return func() bool {
		owner, _ := b.Holder(name)
		return owner == ""
	}
}

// Finding 3: an Unlock whose release never reached the backend (the
// connection was cut) is retried in the background once the backend can be
// reached again, long before the lease's TTL.
func TestUnlockRetriedAfterConnectionCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		c, d := newMem(t, &dlock.Options{TTL: 30 * time.Second, Logger: slog.New(logs)})
		l, err := c.NewMutex("cut", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		k := newCut(d, "release")
		err = l.Unlock(context.Background())
		var oe *dlock.OpError
		if !errors.As(err, &oe) || !errors.Is(err, k.err) {
			t.Fatalf("Unlock with the connection cut = %v, want an *OpError wrapping the backend error", err)
		}
		waitDone(t, l, time.Second)
		if !errors.Is(l.Err(), dlock.ErrReleased) {
			t.Fatalf("Err after a failed Unlock = %v, want ErrReleased", l.Err())
		}
		if owner, _ := d.Backend().Holder("cut"); owner != l.Owner() {
			t.Fatalf("holder %q: the cut should have kept the release from the backend", owner)
		}
		eventually(t, 5*time.Second, "a background retry failing while the connection is cut", func() bool { return k.calls.Load() >= 2 })
		k.on.Store(false)
		eventually(t, 5*time.Second, "the background release to free the lock", free(d.Backend(), "cut"))
		eventually(t, 5*time.Second, "the retry to end", pending(c))
		if logs.count("release failed") == 0 {
			t.Fatalf("failed releases were not logged at Warn: %q", logs.msgs)
		}
		// The lock is free for others now, not in 30s.
		l2, err := c.NewMutex("cut", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock after the background release: %v", err)
		}
		_ = l2.Unlock(context.Background())
	})
}

// A reply lost after the release took effect: the retry finds the lock no
// longer held and stops, touching nobody else's grant.
func TestUnlockRetryAfterLostReplyStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 30 * time.Second})
		l, err := c.NewMutex("lost-reply", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		var once atomic.Bool
		d.LoseReplies(func(op string) error {
			if op == "release" && once.CompareAndSwap(false, true) {
				return errors.New("reply lost")
			}
			return nil
		})
		if err := l.Unlock(context.Background()); err == nil {
			t.Fatal("Unlock with a lost reply succeeded")
		}
		// Someone else takes the lock at once; the retry must leave it alone.
		l2, err := c.NewMutex("lost-reply", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock after a release whose reply was lost: %v", err)
		}
		eventually(t, 5*time.Second, "the retry to end", pending(c))
		if owner, _ := d.Backend().Holder("lost-reply"); owner != l2.Owner() {
			t.Fatalf("the background retry touched the new holder's lock (holder %q)", owner)
		}
		if err := l2.Unlock(context.Background()); err != nil {
			t.Fatalf("new holder's Unlock: %v", err)
		}
	})
}

// A session-bound grant's release is retried until its session ends: then
// the server has freed the lock and the retry stops.
func TestUnlockRetryStopsWhenSessionEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newSessionDriver(nil)
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second, WaitMax: 20 * time.Millisecond})
		defer c.Close()
		l, err := c.NewMutex("session", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		k := newCut(d.Driver, "release")
		if err := l.Unlock(context.Background()); err == nil {
			t.Fatal("Unlock with the connection cut succeeded")
		}
		if dlock.PendingReleases(c) != 1 {
			t.Fatalf("PendingReleases = %d after a failed Unlock, want 1", dlock.PendingReleases(c))
		}
		eventually(t, 5*time.Second, "background retries", func() bool { return k.calls.Load() >= 3 })
		close(d.lost)
		eventually(t, 5*time.Second, "the retry to stop once the session ended", pending(c))
	})
}

// A TTL-bound grant's release is retried until the lease has certainly
// expired on the server, and no longer.
func TestUnlockRetryGivesUpAfterTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 200 * time.Millisecond, ReleaseTimeout: 100 * time.Millisecond, WaitMax: 20 * time.Millisecond})
		l, err := c.NewMutex("ttl", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		k := newCut(d, "release")
		if err := l.Unlock(context.Background()); err == nil {
			t.Fatal("Unlock with the connection cut succeeded")
		}
		start := time.Now()
		eventually(t, 5*time.Second, "the retry to give up after the TTL", pending(c))
		// The bubble's clock is exact: the lease has certainly expired on
		// the server once TTL, drift and a release still in flight
		// (ReleaseTimeout) have passed; the retry must last that long and
		// stop soon after.
		if took := time.Since(start); took < 300*time.Millisecond || took > 400*time.Millisecond {
			t.Fatalf("the retry gave up after %v, want between TTL+ReleaseTimeout (300ms) and 400ms", took)
		}
		if k.calls.Load() < 2 {
			t.Fatalf("%d release attempts, want retries", k.calls.Load())
		}
	})
}

// Close makes one last attempt at a release still being retried, and does
// not hang when the backend does.
func TestCloseMakesLastAttemptOfPendingRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := memlock.NewBackend().NewDriver()
		// Long waits: the background retry will not run before Close.
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second, WaitMin: time.Minute, WaitMax: time.Minute})
		l, err := c.NewMutex("close", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		k := newCut(d, "release")
		if err := l.Unlock(context.Background()); err == nil {
			t.Fatal("Unlock with the connection cut succeeded")
		}
		k.on.Store(false)
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if owner, _ := d.Backend().Holder("close"); owner != "" {
			t.Fatalf("lock still held by %q after Close: the pending release got no last attempt", owner)
		}
	})
}

func TestCloseDoesNotHangOnPendingRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := memlock.NewBackend().NewDriver()
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second, ReleaseTimeout: 100 * time.Millisecond})
		l, err := c.NewMutex("hang", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		d.Pause() // every call hangs until its context ends
		defer d.Resume()
		if err := l.Unlock(context.Background()); err == nil {
			t.Fatal("Unlock on a paused backend succeeded")
		}
		done := make(chan struct{})
		go func() { _ = c.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Close hung on a pending background release")
		}
	})
}

// The clean-up release after an acquire whose outcome is unknown is retried
// too.
func TestCleanupReleaseRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 30 * time.Second})
		lost := errors.New("reply lost")
		d.LoseReplies(func(op string) error {
			if op == "acquire" {
				return lost
			}
			return nil
		})
		k := newCut(d, "release")
		if _, err := c.NewMutex("orphan", nil).TryLock(context.Background()); !errors.Is(err, lost) {
			t.Fatalf("TryLock = %v, want the lost reply's error", err)
		}
		d.LoseReplies(nil)
		if owner, _ := d.Backend().Holder("orphan"); owner == "" {
			t.Fatal("no orphan grant: the test did not set up what it means to")
		}
		k.on.Store(false)
		eventually(t, 5*time.Second, "the orphan grant to be released in the background", free(d.Backend(), "orphan"))
		eventually(t, 5*time.Second, "the retry to end", pending(c))
	})
}

// A late grant whose release fails is retried too.
func TestLateGrantReleaseRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 100 * time.Millisecond})
		d.LoseReplies(func(op string) error {
			if op == "acquire" {
				d.Backend().SkewClock(-time.Minute) // the server keeps the grant
				time.Sleep(150 * time.Millisecond)  // a reply slower than the TTL
			}
			return nil
		})
		k := newCut(d, "release")
		if _, err := c.NewMutex("late", nil).TryLock(context.Background()); err == nil {
			t.Fatal("a grant past its validity was returned")
		}
		d.LoseReplies(nil)
		if owner, _ := d.Backend().Holder("late"); owner == "" {
			t.Fatal("the stale grant is gone already: the test did not set up what it means to")
		}
		k.on.Store(false)
		eventually(t, 5*time.Second, "the stale grant to be released in the background", free(d.Backend(), "late"))
	})
}

// With an explicit owner a release is not retried: it could give up another
// hold of the same owner.
func TestExplicitOwnerReleaseNotRetried(t *testing.T) {
	c, d := newMem(t, nil)
	opts := &dlock.MutexOptions{Owner: "worker-1"}
	outer, err := c.NewMutex("reentrant", opts).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	inner, err := c.NewMutex("reentrant", opts).TryLock(context.Background())
	if err != nil || inner.Count() != 2 {
		t.Fatalf("re-entrant TryLock = %v, count %d", err, inner.Count())
	}
	var once atomic.Bool
	d.LoseReplies(func(op string) error { // the release takes effect, its reply is lost
		if op == "release" && once.CompareAndSwap(false, true) {
			return errors.New("reply lost")
		}
		return nil
	})
	if err := inner.Unlock(context.Background()); err == nil {
		t.Fatal("Unlock with a lost reply succeeded")
	}
	if n := dlock.PendingReleases(c); n != 0 {
		t.Fatalf("PendingReleases = %d: a release with an explicit owner is being retried", n)
	}
	if err := outer.Unlock(context.Background()); err != nil {
		t.Fatalf("outer Unlock: %v", err)
	}
}

// Finding 6: a waiting Lock rides out backend errors.
func TestLockRidesOutBackendErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		c, d := newMem(t, &dlock.Options{WaitMax: 20 * time.Millisecond, Logger: slog.New(logs)})
		var failures atomic.Int32
		d.FailCalls(func(op string) error {
			if op == "acquire" && failures.Add(1) <= 3 {
				return errors.New("connection refused")
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := c.NewMutex("blip", nil).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock through 3 failed attempts: %v", err)
		}
		if n := logs.count("lock attempt failed"); n != 3 {
			t.Fatalf("%d retried failures logged, want 3: %q", n, logs.msgs)
		}
		_ = l.Unlock(context.Background())
	})
}

func TestLockRetryEndsWithContextAndLastError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{WaitMax: 20 * time.Millisecond})
		boom := errors.New("connection refused")
		d.FailCalls(func(op string) error { return boom })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := c.NewMutex("down", nil).Lock(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, boom) {
			t.Fatalf("Lock on a backend that stays down = %v, want DeadlineExceeded and the last backend error", err)
		}
		if errors.Is(err, dlock.ErrLocked) || errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Lock = %v: must not look like a held lock or a lost lease", err)
		}
		d.FailCalls(nil)
	})
}

// lateRefusals is a memlock driver whose refusals come back only once the
// attempt's context has ended, as a quorum attempt's does when it waits
// out a silent node's timeout; it counts the attempts begun on a context
// that had already ended.
type lateRefusals struct {
	*memlock.Driver
	onDone atomic.Int32
}

func (d *lateRefusals) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if ctx.Err() != nil {
		d.onDone.Add(1)
	}
	g, err := d.Driver.TryAcquire(ctx, req)
	if errors.Is(err, driver.ErrLocked) {
		<-ctx.Done()
	}
	return g, err
}

// Subscribe succeeds on an ended context, as a subscription that only
// joins one already made does.
func (d *lateRefusals) Subscribe(_ context.Context, name string) (driver.Subscription, error) {
	return d.Driver.Subscribe(context.Background(), name)
}

// TestNoAttemptOnEndedContext: when a refused attempt outlasts the Lock's
// context, Lock returns the context's error; it starts no other attempt
// (before, the retry that follows a new release subscription ran on the
// ended context, and a quorum driver's attempt then waited out its node
// timeouts once more).
func TestNoAttemptOnEndedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memlock.NewBackend()
		holder := dlock.New(b.NewDriver(), nil)
		defer holder.Close()
		l, err := holder.NewMutex("late", nil).TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Unlock(context.Background())
		d := &lateRefusals{Driver: b.NewDriver()}
		c := dlock.New(d, nil)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := c.NewMutex("late", nil).Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock = %v, want the context's deadline", err)
		}
		if n := d.onDone.Load(); n != 0 {
			t.Errorf("%d attempts began on the ended context", n)
		}
	})
}

func TestLockDoesNotRetryUnsupported(t *testing.T) {
	c, d := newMem(t, nil)
	d.FailCalls(func(op string) error { return fmt.Errorf("no such thing: %w", driver.ErrUnsupported) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.NewMutex("unsupported", nil).Lock(ctx)
	if !errors.Is(err, dlock.ErrUnsupported) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want ErrUnsupported at once", err)
	}
}

func TestFailFastFromURL(t *testing.T) {
	c, err := dlock.Open(context.Background(), "mem://failfast?fail_fast=true")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer c.Close()
	boom := errors.New("connection refused")
	dlock.DriverOf(c).(*memlock.Driver).FailCalls(func(op string) error { return boom })
	_, err = c.NewMutex("x", nil).Lock(context.Background())
	var oe *dlock.OpError
	if !errors.As(err, &oe) || !errors.Is(err, boom) {
		t.Fatalf("Lock with fail_fast=true = %v, want the first backend error as an *OpError", err)
	}
	if _, err := dlock.Open(context.Background(), "mem://failfast?fail_fast=maybe"); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Open with fail_fast=maybe = %v, want ErrInvalid", err)
	}
}

// queueDriver is a Queuer whose first Acquire calls report a session lost
// while waiting.
type queueDriver struct {
	*memlock.Driver
	mu     sync.Mutex
	lose   int
	owners []string
}

func (d *queueDriver) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d.mu.Lock()
	d.owners = append(d.owners, req.Owner)
	lose := d.lose > 0
	d.lose--
	d.mu.Unlock()
	if lose {
		return driver.Grant{}, fmt.Errorf("queue: waiter's session expired: %w", driver.ErrSessionLost)
	}
	return d.Driver.TryAcquire(ctx, req)
}

func TestQueuedLockReenqueuesAfterSessionLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &queueDriver{Driver: memlock.NewBackend().NewDriver(), lose: 2}
		c := dlock.New(d, &dlock.Options{WaitMax: 20 * time.Millisecond})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := c.NewMutex("queued", nil).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock through two lost sessions: %v", err)
		}
		defer l.Unlock(context.Background())
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.owners) != 3 {
			t.Fatalf("%d Acquire calls, want 3", len(d.owners))
		}
		if d.owners[0] == d.owners[1] || d.owners[1] == d.owners[2] || d.owners[2] != l.Owner() {
			t.Fatalf("owners %q (lease %q): each new attempt must use a fresh generated owner", d.owners, l.Owner())
		}
	})
}

// Finding 11: Grant.Lost delivery ends every lease bound to the channel,
// with the driver's cause.
func TestGrantLostEndsLeasesWithCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := fmt.Errorf("session 0x2a expired: %w", driver.ErrSessionLost)
		for _, withCause := range []bool{true, false} {
			var d *sessionDriver
			if withCause {
				d = newSessionDriver(cause)
			} else {
				d = newSessionDriver(nil)
			}
			// Renewal keeps succeeding: only Lost can end the leases.
			c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
			var ls []*dlock.Lease
			for i := 0; i < 3; i++ {
				l, err := c.NewMutex(fmt.Sprintf("lost/%d", i), nil).TryLock(context.Background())
				if err != nil {
					t.Fatalf("TryLock: %v", err)
				}
				ls = append(ls, l)
			}
			close(d.lost)
			for _, l := range ls {
				waitDone(t, l, 5*time.Second)
				if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !errors.Is(l.Err(), driver.ErrSessionLost) {
					t.Fatalf("Err after the session ended = %v, want ErrLeaseLost wrapping ErrSessionLost", l.Err())
				}
				if withCause && !errors.Is(l.Err(), cause) {
					t.Fatalf("Err = %v, want the driver's cause %v", l.Err(), cause)
				}
				if !errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost) {
					t.Fatalf("context.Cause = %v, want ErrLeaseLost", context.Cause(l.Context()))
				}
			}
			_ = c.Close()
		}
	})
}

// Waits between attempts are full jitter: the i-th is drawn from [lo,
// min(lo<<i, hi)], never above hi, and the ceiling does reach hi.
func TestBackoffFullJitter(t *testing.T) {
	lo, hi := 10*time.Millisecond, 80*time.Millisecond
	sawHigh := false
	for range 50 {
		for i, d := range dlock.BackoffDraws(lo, hi, 8) {
			ceiling := min(lo<<i, hi)
			if d < lo || d > ceiling {
				t.Fatalf("wait %d = %v, want within [%v, %v]", i, d, lo, ceiling)
			}
			sawHigh = sawHigh || d > hi/2
		}
	}
	if !sawHigh {
		t.Fatal("no wait above hi/2 in 400 draws: the ceiling does not grow to hi")
	}
	if ds := dlock.BackoffDraws(lo, lo, 3); ds[0] != lo || ds[1] != lo || ds[2] != lo {
		t.Fatalf("lo == hi: waits %v, want %v each", ds, lo)
	}
}

// sessionEndedDriver answers Renew and Release as a session backend whose
// session has just ended: every lease gone, reported as ErrSessionLost only.
type sessionEndedDriver struct{ *memlock.Driver }

func (d sessionEndedDriver) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	errs := make([]error, len(ls))
	for i := range errs {
		errs[i] = fmt.Errorf("session expired: %w", driver.ErrSessionLost)
	}
	return errs, nil
}

func (d sessionEndedDriver) Release(ctx context.Context, l driver.Lease) (int, error) {
	return 0, fmt.Errorf("session expired: %w", driver.ErrSessionLost)
}

// A Renew or Release answer that only wraps ErrSessionLost means the grant is
// gone, as ErrNotHeld does: Extend and Unlock report ErrNotHeld and end the
// lease as lost, rather than an *OpError for a lease that still looks held,
// and nothing is retried in the background.
func TestSessionLostAnswersMeanGone(t *testing.T) {
	ctx := context.Background()
	c := dlock.New(sessionEndedDriver{memlock.NewBackend().NewDriver()}, &dlock.Options{RenewInterval: -1})
	defer c.Close()
	l, err := c.NewMutex("ext", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, time.Minute); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Extend after the session ended = %v, want ErrNotHeld", err)
	}
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !errors.Is(l.Err(), driver.ErrSessionLost) {
		t.Fatalf("lease error after Extend = %v, want ErrLeaseLost wrapping ErrSessionLost", l.Err())
	}
	l2, err := c.NewMutex("unl", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock after the session ended = %v, want ErrNotHeld", err)
	}
	if n := dlock.PendingReleases(c); n != 0 {
		t.Fatalf("%d releases retried in the background for a session that ended", n)
	}
}

// choosyQueuer is a Queuer that queues only the names queues says,
// counting its Acquire and TryAcquire calls. Its Acquire waits for free to
// be closed.
type choosyQueuer struct {
	*memlock.Driver
	queues          func(name string) bool
	free            chan struct{}
	acquires, tries atomic.Int32
}

func (d *choosyQueuer) Queues(req driver.AcquireRequest) bool { return d.queues(req.Name) }

func (d *choosyQueuer) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d.acquires.Add(1)
	select {
	case <-d.free:
	case <-ctx.Done():
		return driver.Grant{}, ctx.Err()
	}
	return d.Driver.TryAcquire(ctx, req)
}

func (d *choosyQueuer) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	d.tries.Add(1)
	return d.Driver.TryAcquire(ctx, req)
}

// TestQueueChooser: a waiting Lock of a name a QueueChooser queues tries
// once (uncontended, that is all) and, refused, waits in Acquire; a name it
// does not queue is a loop over TryAcquire, never Acquire; a TryLock never
// calls Acquire.
func TestQueueChooser(t *testing.T) {
	d := &choosyQueuer{Driver: memlock.NewBackend().NewDriver(), queues: func(name string) bool { return name == "queued" }, free: make(chan struct{})}
	c := dlock.New(d, nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	counts := func(what string, acquires, tries int32) {
		t.Helper()
		if a, n := d.acquires.Swap(0), d.tries.Swap(0); a != acquires || n != tries {
			t.Errorf("%s: %d Acquire and %d TryAcquire calls, want %d and %d", what, a, n, acquires, tries)
		}
	}
	lockUnlock := func(name string) {
		t.Helper()
		l, err := c.NewMutex(name, nil).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lockUnlock("queued")
	counts("uncontended Lock of a queued name", 0, 1)
	lockUnlock("looped")
	counts("uncontended Lock of a looped name", 0, 1)
	held, err := c.NewMutex("queued", nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	counts("TryLock", 0, 1)
	done := make(chan error, 1)
	go func() {
		l, err := c.NewMutex("queued", nil).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		done <- err
	}()
	testwait.Until(t, 5*time.Second, "the waiting Lock in Acquire", func() bool { return d.acquires.Load() == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	close(d.free)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	counts("contended Lock of a queued name", 1, 1)
}
