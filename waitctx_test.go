package dlock_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// errQueuer is a memlock driver made a Queuer that, like a network
// client's request, looks at its context's Err and Deadline but never asks
// for Done unless it has to wait (Redis's driver waits only when refused):
// a refused Acquire waits on Done, polling TryAcquire every millisecond.
type errQueuer struct {
	*memlock.Driver
}

func (d errQueuer) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	for {
		g, err := d.TryAcquire(ctx, req)
		if !errors.Is(err, dlock.ErrLocked) {
			return g, err
		}
		select {
		case <-ctx.Done():
			return driver.Grant{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func (d errQueuer) TryAcquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	if err := ctx.Err(); err != nil {
		return driver.Grant{}, err
	}
	ctx.Deadline()
	return d.Driver.TryAcquire(ctx, req)
}

func (d errQueuer) Release(ctx context.Context, l driver.Lease) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	ctx.Deadline()
	return d.Driver.Release(ctx, l)
}

// An uncontended Lock+Unlock on a Queuer under a cancellable context makes
// the context that also ends when the Client closes only if the driver
// asks for its Done: 5 allocations (6 with -race), where the context and
// the AfterFunc on the Client's close made before each attempt cost 9.
func TestQueuerLockUnlockAllocs(t *testing.T) {
	c := dlock.New(errQueuer{memlock.NewBackend().NewDriver()}, nil)
	defer c.Close()
	m := c.NewMutex("allocs", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	cycle := func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	if n := testing.AllocsPerRun(200, cycle); n > 6 {
		t.Fatalf("an uncontended Lock+Unlock on a Queuer made %v allocations, want at most 6", n)
	}
}

// A Lock waiting in a Queuer's Acquire under a cancellable context returns
// ErrClosed when its Client closes, and one under a context cancelled
// meanwhile returns the context's error: the driver's wait on Done sees
// both.
func TestQueuerWaitEndsOnCloseAndCancel(t *testing.T) {
	for _, closeIt := range []bool{true, false} {
		backend := memlock.NewBackend()
		holder := dlock.New(backend.NewDriver(), nil)
		l, err := holder.NewMutex("q", nil).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Close waits up to ReleaseTimeout for an acquire in flight: only
		// the wait ending on Close returns it within the test's bound.
		c := dlock.New(errQueuer{backend.NewDriver()}, &dlock.Options{ReleaseTimeout: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.NewMutex("q", nil).Lock(ctx)
			errc <- err
		}()
		eventually(t, 5*time.Second, "the waiter's attempts", func() bool { return backend.Calls("acquire") >= 3 })
		want := context.Canceled
		if closeIt {
			want = dlock.ErrClosed
			go c.Close() // returns once the waiting Lock has
		} else {
			cancel()
		}
		select {
		case err := <-errc:
			if !errors.Is(err, want) {
				t.Fatalf("close=%v: waiting Lock = %v, want %v", closeIt, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("close=%v: waiting Lock did not return", closeIt)
		}
		cancel()
		_ = c.Close()
		_ = l.Unlock(context.Background())
		_ = holder.Close()
	}
}

// errSpy's Acquire closes its Client and polls its context's Err, never
// asking for Done, until it reports the close.
type errSpy struct {
	errQueuer
	c     **dlock.Client
	err   *error
	cause *error
}

func (d errSpy) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.Grant, error) {
	go (*d.c).Close()
	deadline := time.Now().Add(5 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		runtime.Gosched() // polls Err, as a driver without Done would
	}
	*d.err, *d.cause = ctx.Err(), context.Cause(ctx)
	return driver.Grant{}, ctx.Err()
}

// A Queuer's request that never asks for Done still sees the Client's close
// through Err (context.Canceled) and context.Cause (ErrClosed).
func TestQueuerErrSeesClose(t *testing.T) {
	var c *dlock.Client
	var err, cause error
	c = dlock.New(errSpy{errQueuer{memlock.NewBackend().NewDriver()}, &c, &err, &cause}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, lerr := c.NewMutex("spy", nil).Lock(ctx)
	_ = c.Close()
	if !errors.Is(lerr, dlock.ErrClosed) {
		t.Fatalf("Lock whose attempt saw Close = %v, want ErrClosed", lerr)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(cause, dlock.ErrClosed) {
		t.Fatalf("the attempt's context after Close: Err = %v, Cause = %v; want context.Canceled, ErrClosed", err, cause)
	}
}
