package locktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// testSemaphore is the semaphore section: on a backend without Permit
// grants it checks that they fail with ErrUnsupported.
func (s *suite) testSemaphore(t *testing.T) {
	c, _ := s.client(t, nil)
	for _, n := range []int{0, -1} {
		if _, err := c.NewSemaphore(uniqueName(t), n, nil).TryAcquire(context.Background()); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryAcquire of a semaphore of %d permits: %v, want ErrInvalid", n, err)
		}
	}
	if !s.kinds[driver.Permit] {
		sem := c.NewSemaphore(uniqueName(t), 2, nil)
		unsupported(t, "TryAcquire", sem.TryAcquire)
		unsupported(t, "Acquire", sem.Acquire)
		return
	}
	runAll(t, []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Limit", s.testSemLimit},
		{"PermitCount", s.testSemPermitCount},
		{"KilledHolderReturns", s.testSemKilledHolder},
		{"LossSignalledOnDrop", s.testSemLoss},
	})
}

// testSemLimit: at most N holders under Clients × 8 goroutines, every
// grant's token above every grant seen before it was asked for, and
// TryAcquire refused when every permit is taken.
func (s *suite) testSemLimit(t *testing.T) {
	name := uniqueName(t)
	const permits, perClient, rounds = 3, 8, 2
	var (
		mu       sync.Mutex
		inside   int
		most     int
		maxSeen  uint64
		tokens   = map[uint64]bool{}
		errOnce  sync.Once
		failure  error
		wg       sync.WaitGroup
		clients  []*dlock.Client
		deadline = 60 * time.Second
	)
	fail := func(err error) { errOnce.Do(func() { failure = err }) }
	for ci := 0; ci < s.cfg.Clients; ci++ {
		c, _ := s.client(t, nil)
		clients = append(clients, c)
		for g := 0; g < perClient; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem := c.NewSemaphore(name, permits, nil)
				for r := 0; r < rounds; r++ {
					mu.Lock()
					before := maxSeen
					mu.Unlock()
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					l, err := sem.Acquire(ctx)
					cancel()
					if err != nil {
						fail(fmt.Errorf("acquire: %w", err))
						return
					}
					mu.Lock()
					inside++
					most = max(most, inside)
					if inside > permits {
						fail(fmt.Errorf("%d holders of a %d-permit semaphore at once", inside, permits))
					}
					if l.Token() <= before {
						fail(fmt.Errorf("permit token %d <= %d, a token granted before it was asked for", l.Token(), before))
					}
					if tokens[l.Token()] {
						fail(fmt.Errorf("permit token %d granted twice", l.Token()))
					}
					tokens[l.Token()] = true
					maxSeen = max(maxSeen, l.Token())
					mu.Unlock()
					pause := time.NewTimer(time.Duration(1+rand.N(3)) * time.Millisecond) // pace the load
					<-pause.C
					mu.Lock()
					inside--
					mu.Unlock()
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
	if want := s.cfg.Clients * perClient * rounds; len(tokens) != want {
		t.Fatalf("%d grants, want %d", len(tokens), want)
	}
	t.Logf("%d grants, at most %d holders at once", len(tokens), most)
	// Full: one permit per client until none is left, then ErrLocked.
	var held []*dlock.Lease
	for i := 0; i < permits; i++ {
		held = append(held, get(t, fmt.Sprintf("TryAcquire of permit %d of %d", i+1, permits),
			clients[i%len(clients)].NewSemaphore(name, permits, nil).TryAcquire))
	}
	for _, c := range clients {
		busy(t, "TryAcquire of a full semaphore", c.NewSemaphore(name, permits, nil).TryAcquire)
	}
	_ = held[0].Unlock(context.Background())
	l := get(t, "TryAcquire once a permit came back", clients[len(clients)-1].NewSemaphore(name, permits, nil).TryAcquire)
	held = append(held[1:], l)
	for _, l := range held {
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	}
}

// testSemPermitCount: a different count is refused while the semaphore is
// in use and changes nothing; an idle semaphore takes its next grant's count.
func (s *suite) testSemPermitCount(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	l1 := get(t, "TryAcquire (2 permits)", a.NewSemaphore(name, 2, nil).TryAcquire)
	for _, n := range []int{1, 3} {
		sem := b.NewSemaphore(name, n, nil)
		if l, err := sem.TryAcquire(context.Background()); !errors.Is(err, dlock.ErrInvalid) {
			if l != nil {
				_ = l.Unlock(context.Background())
			}
			t.Fatalf("TryAcquire with %d permits of a 2-permit semaphore in use: %v, want ErrInvalid", n, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, err := sem.Acquire(ctx)
		cancel()
		if !errors.Is(err, dlock.ErrInvalid) {
			if l != nil {
				_ = l.Unlock(context.Background())
			}
			t.Fatalf("Acquire with %d permits of a 2-permit semaphore in use: %v, want ErrInvalid at once", n, err)
		}
	}
	// Nothing changed: the second of 2 permits is free, the third is not.
	l2 := get(t, "TryAcquire of the second of 2 permits", b.NewSemaphore(name, 2, nil).TryAcquire)
	busy(t, "TryAcquire of a third of 2 permits", b.NewSemaphore(name, 2, nil).TryAcquire)
	if l1.Err() != nil || l2.Err() != nil {
		t.Fatalf("holders' leases ended: %v, %v", l1.Err(), l2.Err())
	}
	_ = l1.Unlock(context.Background())
	_ = l2.Unlock(context.Background())
	// Idle, the semaphore can be resized.
	var held []*dlock.Lease
	for i := 0; i < 3; i++ {
		held = append(held, get(t, fmt.Sprintf("TryAcquire %d of an idle semaphore resized to 3", i+1), a.NewSemaphore(name, 3, nil).TryAcquire))
	}
	busy(t, "TryAcquire of a fourth of 3 permits", b.NewSemaphore(name, 3, nil).TryAcquire)
	for _, l := range held {
		_ = l.Unlock(context.Background())
	}
}

// testSemKilledHolder: a crashed holder's permit comes back after its TTL,
// plus its lock-delay where the backend has one.
func (s *suite) testSemKilledHolder(t *testing.T) {
	a, killA := s.client(t, nil)
	b, _ := s.client(t, nil)
	c, _ := s.client(t, nil)
	name := uniqueName(t)
	var delay time.Duration
	opts := &dlock.MutexOptions{}
	if s.cfg.LockDelay {
		delay = 2 * s.ttl()
		opts.LockDelay = delay
	}
	la := get(t, "TryAcquire", a.NewSemaphore(name, 2, opts).TryAcquire)
	lb := get(t, "TryAcquire", b.NewSemaphore(name, 2, nil).TryAcquire)
	killA()
	killed := time.Now()
	sem := c.NewSemaphore(name, 2, nil)
	busy(t, "TryAcquire while a crashed holder's permit is taken", sem.TryAcquire)
	lc := waitFor(t, "Acquire after a holder crashed", sem.Acquire, 20*s.ttl()+delay+10*time.Second)
	waited := time.Since(killed)
	t.Logf("permit back %v after its holder crashed (TTL %v, lock-delay %v)", waited.Round(time.Millisecond), s.ttl(), delay)
	if waited < delay {
		t.Fatalf("permit came back %v after its holder crashed; its lock-delay %v was not honoured", waited, delay)
	}
	if lc.Token() <= lb.Token() || lc.Token() <= la.Token() {
		t.Fatalf("token %d after a crash <= earlier permits' %d, %d", lc.Token(), la.Token(), lb.Token())
	}
	if lb.Err() != nil {
		t.Fatalf("the live holder's lease ended: %v", lb.Err())
	}
	_ = lc.Unlock(context.Background())
	_ = lb.Unlock(context.Background())
	within(t, la.Done(), 3*s.ttl()+5*time.Second, "crashed holder's Done")
}

func (s *suite) testSemLoss(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := get(t, "TryAcquire", a.NewSemaphore(name, 2, nil).TryAcquire)
	lb := get(t, "TryAcquire", b.NewSemaphore(name, 2, nil).TryAcquire)
	s.dropKind(t, name, driver.Permit)
	s.lost(t, "permit lease", la)
	s.lost(t, "second permit lease", lb)
	lc := getWithin(t, "TryAcquire after the permits were dropped", b.NewSemaphore(name, 2, nil).TryAcquire, 3*s.ttl()+10*time.Second)
	if lc.Token() <= lb.Token() {
		t.Fatalf("token %d after the drop <= a dropped permit's %d", lc.Token(), lb.Token())
	}
	_ = lc.Unlock(context.Background())
}
