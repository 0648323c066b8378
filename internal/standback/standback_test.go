package standback

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock/dlock/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func req(owner string, waiting bool) driver.AcquireRequest {
	return driver.AcquireRequest{Name: "n", Owner: owner, TTL: time.Minute, Waiting: waiting}
}

// waited runs s.Wait and returns how long it took on the bubble's clock.
func waited(t *testing.T, s *StandBack, ctx context.Context, r driver.AcquireRequest, next func(uint64) <-chan struct{}) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.Wait(ctx, r, next); err != nil {
		t.Fatalf("Wait(%s): %v", r.Owner, err)
	}
	return time.Since(start)
}

// TestWait: after Released, a new attempt waits For; a refused waiting
// Lock's retry, another kind, and any attempt once For has passed or the
// name was granted again go at once; a retry without Waiting is not exempt.
func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s := New()
		if d := waited(t, s, ctx, req("a", true), nil); d != 0 {
			t.Fatalf("no release yet: waited %v", d)
		}
		s.Refused(req("w", true))
		s.Refused(req("try", false))
		s.Released("n", 7)
		if d := waited(t, s, ctx, req("w", true), nil); d != 0 {
			t.Fatalf("a refused waiter's retry waited %v", d)
		}
		if !s.Exempt(req("w", true)) || s.Exempt(req("try", false)) || s.Exempt(req("w", false)) {
			t.Fatal("Exempt: want only the waiting Lock that was refused")
		}
		rw := req("r", true)
		rw.Kind = driver.Read
		if d := waited(t, s, ctx, rw, nil); d != 0 {
			t.Fatalf("a read lock waited %v", d)
		}
		if d := waited(t, s, ctx, req("new", true), nil); d != For {
			t.Fatalf("a new attempt waited %v, want %v", d, For)
		}
		if d := waited(t, s, ctx, req("late", true), nil); d != 0 {
			t.Fatalf("an attempt after the stand-back waited %v", d)
		}
		// The grant of the refused waiter ends its exemption.
		if alone := s.Granted(req("w", true), 9); alone {
			t.Fatal("Granted reported a grant right after the release, with token 9 after 7")
		}
		if s.Exempt(req("w", true)) {
			t.Fatal("a granted waiter is still exempt")
		}
	})
}

// TestWaitEnds: a stand-back ends at the next grant when the driver sees
// it, and at ctx's end with its error.
func TestWaitEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New()
		s.Released("n", 1)
		granted := make(chan struct{})
		go func() {
			time.Sleep(time.Millisecond) // the woken waiter's grant, 1ms into the stand-back
			close(granted)
		}()
		if d := waited(t, s, context.Background(), req("a", true), func(uint64) <-chan struct{} { return granted }); d != time.Millisecond {
			t.Fatalf("waited %v, want until the next grant (1ms)", d)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Wait(ctx, req("b", true), nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait on an ended ctx: %v, want Canceled", err)
		}
	})
}

// TestGrantedAlone: a grant whose token follows the releasing one's says
// nobody else was granted in between, and ends the stand-back.
func TestGrantedAlone(t *testing.T) {
	s := New()
	s.Released("n", 4)
	if !s.Granted(req("a", true), 5) {
		t.Fatal("token 5 after a release of 4: want alone")
	}
	if s.Granted(req("a", true), 6) {
		t.Fatal("a grant with no stand-back under way reported alone")
	}
	synctest.Test(t, func(t *testing.T) {
		if d := waited(t, s, context.Background(), req("b", true), nil); d != 0 {
			t.Fatalf("after the grant: waited %v", d)
		}
	})
}

// TestUncontendedAllocatesNothing: with no stand-back under way and no
// refused waiter, an attempt's Wait and its grant's Granted allocate
// nothing (a waiter's key, built on every call, cost memlock's
// Lock+Unlock two allocations).
func TestUncontendedAllocatesNothing(t *testing.T) {
	s := New()
	r := driver.AcquireRequest{Name: "orders/with-a-long-enough-name", Owner: "AcGjud0ijJVmtQE0-fzdjQ", TTL: time.Minute, Waiting: true}
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() {
		_ = s.Wait(ctx, r, nil)
		s.Granted(r, 1)
		_ = s.Exempt(r)
	}); n != 0 {
		t.Fatalf("%v allocations per uncontended attempt, want 0", n)
	}
}
