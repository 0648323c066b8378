package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
	"github.com/dlock/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newMem returns a client over a fresh memlock backend.
func newMem(t *testing.T, opts *dlock.Options) (*dlock.Client, *memlock.Driver) {
	t.Helper()
	d := memlock.NewBackend().NewDriver()
	c := dlock.New(d, opts)
	t.Cleanup(func() { _ = c.Close() })
	return c, d
}

// eventually polls cond until it holds, failing t after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, within, what, cond)
}

func waitDone(t *testing.T, l *dlock.Lease, d time.Duration) {
	t.Helper()
	select {
	case <-l.Done():
	case <-time.After(d):
		t.Fatalf("lease %q not ended within %v", l.Name(), d)
	}
}

func TestOpenUnknownSchemeListsRegistered(t *testing.T) {
	_, err := dlock.Open(context.Background(), "nosuch://host/x")
	if !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Open(unknown) = %v, want ErrInvalid", err)
	}
	for _, want := range []string{`"nosuch"`, "mem", "forgotten import"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not mention %s", err, want)
		}
	}
}

func TestOpenBadURLs(t *testing.T) {
	for _, u := range []string{"", "no-scheme", "mem://x?ttl=soon", "mem://x?ttl=1s&ttl=2s", "mem://x?ttl=-1s", "mem://x?wait_min=2s&wait_max=1s", "mem://x?bogus=1", "::not a url"} {
		c, err := dlock.Open(context.Background(), u)
		if err == nil {
			_ = c.Close()
			t.Fatalf("Open(%q) succeeded", u)
		}
	}
}

func TestOpenAppliesClientParams(t *testing.T) {
	c, err := dlock.Open(context.Background(), "mem://params?ttl=2s&lock_delay=0&wait_max=50ms")
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer c.Close()
	l, err := c.NewMutex("x", nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if v := l.ValidFor(); v > 2*time.Second || v < time.Second {
		t.Fatalf("ValidFor = %v with ttl=2s", v)
	}
}

// Loss is signalled locally before the server could have handed the lock to
// anyone else: renewal is cut off, and Done must close while the backend
// still records this lease as the holder.
func TestLossSignalledBeforeServerExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 300 * time.Millisecond})
		l, err := c.NewMutex("job", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		d.FailCalls(func(op string) error {
			if op == "renew" {
				return errors.New("network down")
			}
			return nil
		})
		waitDone(t, l, 2*time.Second)
		if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("Err = %v, want ErrLeaseLost", l.Err())
		}
		if owner, _ := d.Backend().Holder("job"); owner != l.Owner() {
			t.Fatalf("the server no longer had the lease when loss was signalled (holder %q): the local deadline came too late", owner)
		}
	})
}

// The validity deadline runs from when the acquire was sent, not from when
// its reply arrived.
func TestValidityCountsFromSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: time.Second, RenewInterval: -1})
		d.DelayCalls(400 * time.Millisecond)
		l, err := c.NewMutex("slow", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		d.DelayCalls(0)
		// On the bubble's clock the 400ms are exact: from the send, at most
		// 600ms are left (less the drift); from the reply it would be ~1s.
		if v := l.ValidFor(); v > 600*time.Millisecond || v <= 0 {
			t.Fatalf("ValidFor = %v after a 400ms acquire with TTL 1s: want (0, 600ms], counted from the send", v)
		}
		waitDone(t, l, 2*time.Second)
	})
}

// Leases taken at different times fall into step: K leases cost one renew
// call per tick, not K.
func TestRenewalIsBatched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 600 * time.Millisecond}) // renewed every 200ms
		b := d.Backend()
		const n = 200
		var leases []*dlock.Lease
		for i := 0; i < n; i++ {
			l, err := c.NewMutex(fmt.Sprintf("batch/%d", i), nil).TryLock(context.Background())
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			leases = append(leases, l)
			// One lease a millisecond: their due times spread over a whole
			// renewal interval.
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Second) // 1.2s in all: six renewal intervals
		took := b.Calls("renew")
		for _, l := range leases {
			if l.Err() != nil {
				t.Fatalf("lease lost during batched renewal: %v", l.Err())
			}
		}
		// Due at 200ms..399ms: two batches bring them into step (200ms,
		// 301ms), then one call per 200ms.
		if took < 5 || took > 7 {
			t.Fatalf("%d renew calls for %d leases over six renewal intervals: want 5 to 7 (one per tick, batched)", took, n)
		}
	})
}

func TestServerClockJumpLosesLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 500 * time.Millisecond})
		l, err := c.NewMutex("jump", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		d.Backend().SkewClock(time.Hour) // the server's clock leaps: the lease expires there
		waitDone(t, l, 3*time.Second)
		if !errors.Is(l.Err(), dlock.ErrLeaseLost) || !errors.Is(l.Err(), dlock.ErrNotHeld) {
			t.Fatalf("Err = %v, want ErrLeaseLost wrapping ErrNotHeld", l.Err())
		}
	})
}

func TestPausedDriverLosesLeaseAndLateUnlockIsHarmless(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		backend := memlock.NewBackend()
		da, db := backend.NewDriver(), backend.NewDriver()
		a := dlock.New(da, &dlock.Options{TTL: 300 * time.Millisecond})
		b := dlock.New(db, &dlock.Options{TTL: 300 * time.Millisecond, WaitMax: 20 * time.Millisecond})
		defer a.Close()
		defer b.Close()
		la, err := a.NewMutex("p", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		da.Pause() // partitioned: renewals hang
		waitDone(t, la, 2*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lb, err := b.NewMutex("p", nil).Lock(ctx)
		if err != nil {
			t.Fatalf("B Lock: %v", err)
		}
		da.Resume()
		if err := la.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
			t.Fatalf("late Unlock = %v, want ErrNotHeld", err)
		}
		if owner, tok := backend.Holder("p"); owner != lb.Owner() || tok != lb.Token() {
			t.Fatalf("late Unlock touched the new holder's lock: holder %q token %d", owner, tok)
		}
		if lb.Token() <= la.Token() {
			t.Fatalf("token %d <= %d", lb.Token(), la.Token())
		}
	})
}

func TestUnlockIgnoresCancelledContext(t *testing.T) {
	c, d := newMem(t, nil)
	l, err := c.NewMutex("u", nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with a cancelled context: %v", err)
	}
	if owner, _ := d.Backend().Holder("u"); owner != "" {
		t.Fatalf("lock still held by %q after Unlock", owner)
	}
}

func TestUnlockBackendErrorEndsLease(t *testing.T) {
	c, d := newMem(t, nil)
	l, err := c.NewMutex("e", nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	boom := errors.New("connection reset")
	d.FailCalls(func(op string) error { return boom })
	err = l.Unlock(context.Background())
	var oe *dlock.OpError
	if !errors.Is(err, boom) || !errors.As(err, &oe) || oe.Op != "unlock" {
		t.Fatalf("Unlock = %v, want an OpError wrapping the backend error", err)
	}
	waitDone(t, l, time.Second)
}

func TestLockReturnsBackendErrorsDistinctly(t *testing.T) {
	c, d := newMem(t, nil)
	boom := errors.New("connection refused")
	d.FailCalls(func(op string) error { return boom })
	_, err := c.NewMutex("x", &dlock.MutexOptions{FailFast: true}).Lock(context.Background())
	var oe *dlock.OpError
	if !errors.As(err, &oe) || !errors.Is(err, boom) {
		t.Fatalf("Lock = %v, want an *OpError wrapping the backend error", err)
	}
	if errors.Is(err, dlock.ErrLocked) || errors.Is(err, dlock.ErrLeaseLost) || errors.Is(err, context.Canceled) {
		t.Fatalf("Lock = %v: backend errors must be told apart", err)
	}
}

func TestAcquireWithUnknownOutcomeLeavesNothing(t *testing.T) {
	c, d := newMem(t, nil)
	lost := errors.New("reply lost")
	// The grant happens on the backend, but its reply never arrives.
	d.LoseReplies(func(op string) error {
		if op == "acquire" {
			return lost
		}
		return nil
	})
	_, err := c.NewMutex("lost-reply", nil).TryLock(context.Background())
	if !errors.Is(err, lost) {
		t.Fatalf("TryLock = %v, want the lost reply's error", err)
	}
	if owner, _ := d.Backend().Holder("lost-reply"); owner != "" {
		t.Fatalf("an orphan grant was left behind for %q", owner)
	}
}

func TestCloseStopsWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		backend := memlock.NewBackend()
		a := dlock.New(backend.NewDriver(), nil)
		defer a.Close()
		la, err := a.NewMutex("w", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		defer la.Unlock(context.Background())
		b := dlock.New(backend.NewDriver(), nil)
		errc := make(chan error, 1)
		go func() {
			_, err := b.NewMutex("w", nil).Lock(context.Background())
			errc <- err
		}()
		// Wait until the waiter has subscribed and tried again, then close its
		// client.
		eventually(t, 5*time.Second, "the waiter's second attempt", func() bool { return backend.Calls("acquire") >= 2 })
		_ = b.Close()
		select {
		case err := <-errc:
			if !errors.Is(err, dlock.ErrClosed) {
				t.Fatalf("waiting Lock after Close = %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("waiting Lock did not return after Close")
		}
	})
}

// A Close while a waiting Lock's first attempt is in flight (a slow
// backend) makes Lock return ErrClosed and leaves nothing held, whether the
// caller's context can be cancelled (the attempt runs on it alone, and Close
// waits for it to release what it was granted) or not (the attempt runs on a
// context Close cancels).
func TestCloseDuringFirstAttempt(t *testing.T) {
	for _, tc := range []struct {
		name             string
		cancellable, try bool
	}{{"cancellable=false", false, false}, {"cancellable=true", true, false}, {"trylock", false, true}} {
		cancellable := tc.cancellable
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				backend := memlock.NewBackend()
				d := backend.NewDriver()
				c := dlock.New(d, nil)
				d.DelayCalls(time.Second)
				ctx := context.Background()
				if cancellable {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
				}
				errc := make(chan error, 1)
				go func() {
					m := c.NewMutex("first", nil)
					var err error
					if tc.try {
						_, err = m.TryLock(ctx)
					} else {
						_, err = m.Lock(ctx)
					}
					errc <- err
				}()
				synctest.Wait() // the attempt is in the driver's delay
				if err := c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if err := <-errc; !errors.Is(err, dlock.ErrClosed) {
					t.Fatalf("%s during Close = %v, want ErrClosed", tc.name, err)
				}
				if owner, _ := backend.Holder("first"); owner != "" {
					t.Fatalf("the lock is left held by %q after Close", owner)
				}
			})
		})
	}
}

func TestDoReportsLossDuringWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 300 * time.Millisecond})
		err := c.Do(context.Background(), "work", nil, func(ctx context.Context, l *dlock.Lease) error {
			d.Backend().Drop("work")
			<-ctx.Done() // the work is told to stop
			if !errors.Is(context.Cause(ctx), dlock.ErrLeaseLost) {
				return fmt.Errorf("cause = %v", context.Cause(ctx))
			}
			return nil
		})
		if !errors.Is(err, dlock.ErrLeaseLost) {
			t.Fatalf("Do = %v, want ErrLeaseLost", err)
		}
	})
}

func TestDoHonoursCallerContext(t *testing.T) {
	c, _ := newMem(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	err := c.Do(ctx, "cancel", nil, func(ctx context.Context, l *dlock.Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
	if l, err := c.NewMutex("cancel", nil).TryLock(context.Background()); err != nil {
		t.Fatalf("lock not released after Do: %v", err)
	} else {
		_ = l.Unlock(context.Background())
	}
}

func TestNewPanicsOnBadOptions(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "TTL") {
			t.Fatalf("New with TTL 1ns: recover() = %v, want a panic naming TTL", r)
		}
	}()
	dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{TTL: time.Nanosecond})
}

func TestOptionsValidate(t *testing.T) {
	if err := (&dlock.Options{}).Validate(); err != nil {
		t.Fatalf("zero Options: %v", err)
	}
	var ie *dlock.InvalidArgumentError
	if err := (&dlock.Options{WaitMin: time.Second, WaitMax: time.Millisecond}).Validate(); !errors.As(err, &ie) || ie.Arg != "WaitMax" {
		t.Fatalf("Validate = %v, want an error naming WaitMax", err)
	}
}

// A grant whose reply arrives after the lease's own validity deadline is
// refused and released, never handed to the caller as if it were valid. The
// server's clock steps back while the reply is slow, so the grant is still
// held there and only the release frees it.
func TestGrantPastValidityIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, d := newMem(t, &dlock.Options{TTL: 100 * time.Millisecond})
		d.LoseReplies(func(op string) error {
			if op == "acquire" {
				d.Backend().SkewClock(-time.Minute) // the grant outlives the slow reply on the server
				time.Sleep(150 * time.Millisecond)  // a reply slower than the TTL
			}
			return nil
		})
		_, err := c.NewMutex("slow-reply", nil).TryLock(context.Background())
		var oe *dlock.OpError
		if !errors.As(err, &oe) {
			t.Fatalf("TryLock with a reply slower than the TTL = %v, want an *OpError", err)
		}
		d.LoseReplies(nil)
		if owner, _ := d.Backend().Holder("slow-reply"); owner != "" {
			t.Fatalf("the stale grant was left held by %q", owner)
		}
	})
}

// lossDriver hands out a fresh loss channel per grant, as drivers with a
// pinned connection per lock do.
type lossDriver struct{ *memlock.Driver }

func (d lossDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	g, err := d.Driver.TryAcquire(ctx, req)
	g.Lost = make(chan struct{})
	return g, err
}

// Released leases stop their loss watchers: no goroutine per past grant.
func TestLossWatchersEndWithTheirLeases(t *testing.T) {
	c := dlock.New(lossDriver{memlock.NewBackend().NewDriver()}, nil)
	defer c.Close()
	before := runtime.NumGoroutine()
	for i := 0; i < 200; i++ {
		l, err := c.NewMutex("w", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	}
	eventually(t, 5*time.Second, "loss watchers to stop after 200 grants", func() bool { return runtime.NumGoroutine() <= before+5 })
}

// sentDriver reports every grant as confirmed by a session refresh sent
// `ago` before the call, as etcd's shared leases do: the server counts the
// lease from that keepalive, not from the acquire.
type sentDriver struct {
	*memlock.Driver
	ago time.Duration
}

func (d sentDriver) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	refreshed := time.Now().Add(-d.ago)
	g, err := d.Driver.TryAcquire(ctx, req)
	g.Sent = refreshed
	return g, err
}

// A grant whose session was last refreshed before the call is valid for its
// TTL from that refresh, not from the call: counting from the call overstated
// validity by up to a keepalive interval, and the checker saw an etcd waiter
// granted while a paused holder still believed its lease valid.
func TestValidityCountsFromAnEarlierSessionRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := dlock.New(sentDriver{memlock.NewBackend().NewDriver(), 300 * time.Millisecond}, &dlock.Options{TTL: time.Second, RenewInterval: -1})
		defer c.Close()
		l, err := c.NewMutex("shared-session", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		if v := l.ValidFor(); v > 700*time.Millisecond || v <= 0 {
			t.Fatalf("ValidFor = %v for a TTL 1s grant on a session refreshed 300ms before the call: want (0, 700ms]", v)
		}
	})
}
