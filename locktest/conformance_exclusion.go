package locktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

func (s *suite) testLockUnlock(t *testing.T) {
	c, _ := s.client(t, nil)
	m := c.NewMutex(uniqueName(t), nil)
	l := mustLock(t, m, 10*time.Second)
	if l.Token() == 0 {
		t.Fatal("Token() = 0; tokens must be positive")
	}
	if l.Err() != nil {
		t.Fatalf("Err() = %v while held", l.Err())
	}
	if l.Count() != 1 {
		t.Fatalf("Count() = %d, want 1", l.Count())
	}
	select {
	case <-l.Done():
		t.Fatal("Done closed while held")
	default:
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	within(t, l.Done(), time.Second, "Done after Unlock")
	if !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("Err() after Unlock = %v, want ErrReleased", l.Err())
	}
	within(t, l.Context().Done(), time.Second, "Context after Unlock")
	if err := l.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
	}
	if err := l.Extend(context.Background(), s.ttl()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Extend after Unlock = %v, want ErrNotHeld", err)
	}
}

func (s *suite) testTryLockHeld(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	wantLocked(t, b.NewMutex(name, nil))
	wantLocked(t, a.NewMutex(name, nil)) // another lease on the same client is another owner
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	lb := mustTry(t, b.NewMutex(name, nil))
	if lb.Token() <= la.Token() {
		t.Fatalf("token after hand-over %d <= previous %d", lb.Token(), la.Token())
	}
	_ = lb.Unlock(context.Background())
}

func (s *suite) testMutualExclusion(t *testing.T) {
	name := uniqueName(t)
	const perClient, rounds = 3, 4
	var (
		inside  atomic.Int32
		mu      sync.Mutex
		tokens  []uint64
		wg      sync.WaitGroup
		errOnce sync.Once
		failure error
	)
	fail := func(err error) { errOnce.Do(func() { failure = err }) }
	for ci := 0; ci < s.cfg.Clients; ci++ {
		c, _ := s.client(t, nil)
		for g := 0; g < perClient; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.NewMutex(name, nil)
				for r := 0; r < rounds; r++ {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					l, err := m.Lock(ctx)
					cancel()
					if err != nil {
						fail(fmt.Errorf("lock: %w", err))
						return
					}
					if n := inside.Add(1); n != 1 {
						fail(fmt.Errorf("%d holders inside the critical section at once", n))
					}
					mu.Lock()
					tokens = append(tokens, l.Token())
					mu.Unlock()
					inside.Add(-1)
					if err := l.Unlock(context.Background()); err != nil {
						fail(fmt.Errorf("unlock: %w", err))
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens not strictly increasing in grant order: %v", tokens)
		}
	}
	if want := s.cfg.Clients * perClient * rounds; len(tokens) != want {
		t.Fatalf("%d grants, want %d", len(tokens), want)
	}
}

func (s *suite) testHandOff(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := b.NewMutex(name, &dlock.MutexOptions{WaitMax: 50 * time.Millisecond}).Lock(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	// The waiter must not get the lock while it is held and renewed.
	select {
	case l := <-got:
		t.Fatalf("waiter got the lock (token %d) while it was held", l.Token())
	case err := <-errc:
		t.Fatalf("waiting Lock: %v", err)
	case <-time.After(s.ttl() / 2):
	}
	released := time.Now()
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	select {
	case l := <-got:
		// Prompt: well before the released lease would have expired.
		if d := time.Since(released); d > s.ttl() {
			t.Fatalf("hand-off took %v, longer than the TTL %v", d, s.ttl())
		}
		if l.Token() <= la.Token() {
			t.Fatalf("token %d after hand-off <= previous %d", l.Token(), la.Token())
		}
		_ = l.Unlock(context.Background())
	case err := <-errc:
		t.Fatalf("waiting Lock: %v", err)
	case <-time.After(10 * s.ttl()):
		t.Fatal("waiter never got the released lock")
	}
}

func (s *suite) testReleaseFreesAtOnce(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	opts := &dlock.MutexOptions{TTL: 30 * time.Second}
	if s.cfg.LockDelay {
		opts.LockDelay = 30 * time.Second
	}
	la := mustTry(t, a.NewMutex(name, opts))
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	lb := mustTry(t, b.NewMutex(name, nil)) // no delay after a clean release
	_ = lb.Unlock(context.Background())
}
