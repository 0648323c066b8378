package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// renewCall is one driver.Renew call seen by a renewLog.
type renewCall struct {
	at    time.Duration // since the log was made
	names []string      // sorted
}

// renewLog records every Renew call of the memlock driver it wraps, and
// answers the renewal of the leases whose name fail picks with an error of
// unknown outcome (a lost reply), as a flaky network would.
type renewLog struct {
	*memlock.Driver
	start time.Time
	fail  func(name string) bool

	mu    sync.Mutex
	calls []renewCall
}

func newRenewLog(fail func(string) bool) *renewLog {
	return &renewLog{Driver: memlock.NewBackend().NewDriver(), start: time.Now(), fail: fail}
}

func (d *renewLog) Renew(ctx context.Context, ls []driver.Lease) ([]error, error) {
	call := renewCall{at: time.Since(d.start)}
	var pass []driver.Lease
	var at []int
	for i, l := range ls {
		call.names = append(call.names, l.Name)
		if d.fail == nil || !d.fail(l.Name) {
			pass = append(pass, l)
			at = append(at, i)
		}
	}
	slices.Sort(call.names)
	d.mu.Lock()
	d.calls = append(d.calls, call)
	d.mu.Unlock()
	errs := make([]error, len(ls))
	for i := range errs {
		errs[i] = errors.New("renew reply lost")
	}
	perr, err := d.Driver.Renew(ctx, pass)
	if err != nil {
		return nil, err
	}
	for j, e := range perr {
		errs[at[j]] = e
	}
	return errs, nil
}

func (d *renewLog) log() []renewCall {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// The renewer serves the lease that falls due first, whatever the order the
// leases were taken in, and batches a lease with a longer interval only once
// it is within half that interval of falling due.
func TestEarlierDueLeaseRenewedFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newRenewLog(nil)
		c := dlock.New(d, &dlock.Options{TTL: 3 * time.Second}) // renewed every 1s
		defer c.Close()
		ctx := context.Background()
		slow, err := c.NewMutex("slow", nil).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock slow: %v", err)
		}
		fast, err := c.NewMutex("fast", &dlock.MutexOptions{TTL: 600 * time.Millisecond}).TryLock(ctx) // every 200ms
		if err != nil {
			t.Fatalf("TryLock fast: %v", err)
		}
		time.Sleep(650 * time.Millisecond)
		synctest.Wait()
		want := []renewCall{
			{200 * time.Millisecond, []string{"fast"}},
			{400 * time.Millisecond, []string{"fast"}},
			// slow falls due at 1s: from 500ms on it joins a batch.
			{600 * time.Millisecond, []string{"fast", "slow"}},
		}
		got := d.log()
		if !sameCalls(got, want) {
			t.Fatalf("renew calls %v, want %v", got, want)
		}
		for _, l := range []*dlock.Lease{slow, fast} {
			if l.Err() != nil {
				t.Fatalf("lease %q ended: %v", l.Name(), l.Err())
			}
		}
	})
}

// sameCalls compares renew calls, their times to within a millisecond.
func sameCalls(got, want []renewCall) bool {
	return slices.EqualFunc(got, want, func(g, w renewCall) bool {
		return g.at >= w.at && g.at < w.at+time.Millisecond && slices.Equal(g.names, w.names)
	})
}

// Extending a lease to a longer TTL moves its renewals to the longer
// interval; shortening it again brings them back.
func TestExtendMovesRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newRenewLog(nil)
		c := dlock.New(d, &dlock.Options{TTL: 600 * time.Millisecond}) // every 200ms
		defer c.Close()
		ctx := context.Background()
		l, err := c.NewMutex("x", nil).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
		if err := l.Extend(ctx, 3*time.Second); err != nil { // every 1s, from 100ms
			t.Fatalf("Extend: %v", err)
		}
		time.Sleep(1050 * time.Millisecond)
		synctest.Wait()
		// Extend's own call, then one a second later.
		want := []renewCall{{100 * time.Millisecond, []string{"x"}}, {1100 * time.Millisecond, []string{"x"}}}
		if got := d.log(); !sameCalls(got, want) {
			t.Fatalf("renew calls %v after Extend to 3s at 100ms, want %v", got, want)
		}
		if err := l.Extend(ctx, 600*time.Millisecond); err != nil { // every 200ms, from 1150ms
			t.Fatalf("Extend: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		want = append(want, renewCall{1150 * time.Millisecond, []string{"x"}}, renewCall{1350 * time.Millisecond, []string{"x"}})
		if got := d.log(); !sameCalls(got, want) {
			t.Fatalf("renew calls %v after Extend back to 600ms at 1150ms, want %v", got, want)
		}
		if l.Err() != nil {
			t.Fatalf("lease ended: %v", l.Err())
		}
	})
}

// With many leases held, each lease whose renewals keep failing is lost at
// its own validity deadline, while the server still has it, and the others
// stay held.
func TestManyLeasesLostAtTheirDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newRenewLog(func(name string) bool { return strings.HasPrefix(name, "doomed/") })
		c := dlock.New(d, &dlock.Options{TTL: time.Second})
		defer c.Close()
		ctx := context.Background()
		start := time.Now()
		type lost struct {
			at     time.Duration
			holder string // the server's holder when loss was signalled
		}
		const n = 150
		var (
			kept, doomed []*dlock.Lease
			ttls         []time.Duration
			grants       []time.Duration
			losses       = make([]lost, n)
			wg           sync.WaitGroup
		)
		for i := range n {
			l, err := c.NewMutex(fmt.Sprintf("kept/%d", i), nil).TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			kept = append(kept, l)
			// Deadlines in a shuffled order, many of them earlier than
			// those of leases taken before: TTLs 1.8s down to 310ms.
			ttl := 1800*time.Millisecond - time.Duration((i*37)%n)*10*time.Millisecond
			l, err = c.NewMutex(fmt.Sprintf("doomed/%d", i), &dlock.MutexOptions{TTL: ttl}).TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			doomed, ttls, grants = append(doomed, l), append(ttls, ttl), append(grants, time.Since(start))
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-l.Done()
				owner, _ := d.Backend().Holder(l.Name())
				losses[i] = lost{time.Since(start), owner}
			}()
			time.Sleep(3 * time.Millisecond)
		}
		wg.Wait()
		for i, l := range doomed {
			if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
				t.Fatalf("%s: Err = %v, want ErrLeaseLost", l.Name(), l.Err())
			}
			deadline := grants[i] + ttls[i] - (ttls[i]/100 + 2*time.Millisecond) // less the default drift
			if got := losses[i].at; got < deadline || got > deadline+time.Millisecond {
				t.Fatalf("%s (TTL %v, granted at %v) lost at %v, want at its deadline %v", l.Name(), ttls[i], grants[i], got, deadline)
			}
			if losses[i].holder != l.Owner() {
				t.Fatalf("%s: when loss was signalled the server's holder was %q, not the lease's owner: signalled too late", l.Name(), losses[i].holder)
			}
		}
		for _, l := range kept {
			if l.Err() != nil {
				t.Fatalf("%s ended: %v", l.Name(), l.Err())
			}
		}
	})
}

// Close ends and releases every lease the client still holds, whichever of
// them were given up before.
func TestCloseEndsEveryLeaseHeld(t *testing.T) {
	c, d := newMem(t, nil)
	ctx := context.Background()
	var held []*dlock.Lease
	for i := range 300 {
		l, err := c.NewMutex(fmt.Sprintf("close/%d", i), nil).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		held = append(held, l)
	}
	// Unlock the first, the last and every third in between.
	var kept []*dlock.Lease
	for i, l := range held {
		if i == 0 || i == len(held)-1 || i%3 == 1 {
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			continue
		}
		kept = append(kept, l)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, l := range kept {
		waitDone(t, l, 5*time.Second)
		if !errors.Is(l.Err(), dlock.ErrClosed) {
			t.Fatalf("%s: Err = %v, want ErrClosed", l.Name(), l.Err())
		}
		if owner, _ := d.Backend().Holder(l.Name()); owner != "" {
			t.Fatalf("%s still held by %q after Close", l.Name(), owner)
		}
	}
}

type ctxKey struct{}

// Done and Context are made on first use; asked for before or after the
// lease ends, they signal its end the same way.
func TestLeaseSignalsOnDemand(t *testing.T) {
	c, _ := newMem(t, nil)
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	early, err := c.NewMutex("early", nil).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	late, err := c.NewMutex("late", nil).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	done, lctx := early.Done(), early.Context()
	if early.Done() != done || early.Context() != lctx {
		t.Fatal("Done or Context changed between two calls")
	}
	select {
	case <-done:
		t.Fatal("Done closed while the lease is held")
	case <-lctx.Done():
		t.Fatal("Context cancelled while the lease is held")
	default:
	}
	for _, l := range []*dlock.Lease{early, late} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		waitDone(t, l, 5*time.Second)
		lc := l.Context()
		select {
		case <-lc.Done():
		default:
			t.Fatalf("%s: Context not cancelled after Unlock", l.Name())
		}
		if !errors.Is(context.Cause(lc), dlock.ErrReleased) || !errors.Is(l.Err(), dlock.ErrReleased) {
			t.Fatalf("%s: cause %v, Err %v, want ErrReleased", l.Name(), context.Cause(lc), l.Err())
		}
		if lc.Value(ctxKey{}) != "v" {
			t.Fatalf("%s: Context lost the values of Lock's context", l.Name())
		}
	}
}

// Done and Context may be asked for while the lease ends, from any goroutine.
func TestLeaseSignalsAskedWhileEnding(t *testing.T) {
	c, _ := newMem(t, nil)
	ctx := context.Background()
	for i := range 50 {
		l, err := c.NewMutex(fmt.Sprintf("race/%d", i), nil).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
		if i%2 == 0 {
			l.Done() // made before the end: ended by it
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-l.Context().Done()
		}()
		go func() {
			defer wg.Done()
			<-l.Done()
		}()
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		wg.Wait()
		if !errors.Is(context.Cause(l.Context()), dlock.ErrReleased) {
			t.Fatalf("cause %v, want ErrReleased", context.Cause(l.Context()))
		}
	}
}

// A lease whose deadline passes while Close is still releasing it (the
// backend does not answer) is reported lost at its deadline, not ended with
// ErrClosed only when the release gives up.
func TestLossDuringSlowClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := memlock.NewBackend().NewDriver()
		c := dlock.New(d, &dlock.Options{TTL: 300 * time.Millisecond, ReleaseTimeout: 5 * time.Second})
		l, err := c.NewMutex("slow-close", nil).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		start := time.Now()
		d.Pause() // the release hangs until the release timeout
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		<-l.Done()
		if took := time.Since(start); took > time.Second || !errors.Is(l.Err(), dlock.ErrLeaseLost) {
			t.Fatalf("lease ended after %v with %v during a hung Close: want ErrLeaseLost at its deadline (<300ms)", took, l.Err())
		}
		d.Resume()
		<-closed
	})
}
