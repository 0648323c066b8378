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

// testRWMutex is the read/write lock section: on a backend without Read and
// Write grants it checks that both sides fail with ErrUnsupported.
func (s *suite) testRWMutex(t *testing.T) {
	if s.kinds[driver.Read] != s.kinds[driver.Write] {
		t.Fatalf("the driver supports Read %v but Write %v: a read/write lock needs both", s.kinds[driver.Read], s.kinds[driver.Write])
	}
	if !s.kinds[driver.Read] {
		c, _ := s.client(t, nil)
		rw := c.NewRWMutex(uniqueName(t), nil)
		unsupported(t, "TryRLock", rw.TryRLock)
		unsupported(t, "RLock", rw.RLock)
		unsupported(t, "TryLock", rw.TryLock)
		unsupported(t, "Lock", rw.Lock)
		return
	}
	runAll(t, []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ReadersShare", s.testRWReadersShare},
		{"WriterExcludes", s.testRWExclusion},
		{"WriterPreference", s.testRWWriterPreference},
		{"WithdrawnWriter", s.testRWWithdrawn},
		{"LossSignalledOnDrop", s.testRWLoss},
		{"KilledReaderFreesWriter", s.testRWKilledReader},
	})
}

func (s *suite) testRWReadersShare(t *testing.T) {
	name := uniqueName(t)
	var readers []*dlock.Lease
	for i := 0; i < s.cfg.Clients; i++ {
		c, _ := s.client(t, nil)
		l := get(t, fmt.Sprintf("TryRLock by client %d while others read", i), c.NewRWMutex(name, nil).TryRLock)
		if l.Kind() != "read" {
			t.Fatalf("read lease's Kind() = %q, want read", l.Kind())
		}
		if n := len(readers); n > 0 && l.Token() <= readers[n-1].Token() {
			t.Fatalf("read grant's token %d <= the earlier read grant's %d", l.Token(), readers[n-1].Token())
		}
		readers = append(readers, l)
	}
	other, _ := s.client(t, nil)
	rw := other.NewRWMutex(name, nil)
	busy(t, "TryLock while readers hold", rw.TryLock)
	// Each kind of a name is its own lock: the Mutex of the name is free.
	lm := mustTry(t, other.NewMutex(name, nil))
	_ = lm.Unlock(context.Background())
	for _, l := range readers {
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatalf("reader's Unlock: %v", err)
		}
	}
	lw := get(t, "TryLock once the readers left", rw.TryLock)
	if lw.Kind() != "write" {
		t.Fatalf("write lease's Kind() = %q, want write", lw.Kind())
	}
	if last := readers[len(readers)-1].Token(); lw.Token() <= last {
		t.Fatalf("write grant's token %d <= an earlier read grant's %d", lw.Token(), last)
	}
	first, _ := s.client(t, nil)
	busy(t, "TryRLock while a writer holds", first.NewRWMutex(name, nil).TryRLock)
	busy(t, "TryLock while a writer holds", first.NewRWMutex(name, nil).TryLock)
	if err := lw.Unlock(context.Background()); err != nil {
		t.Fatalf("writer's Unlock: %v", err)
	}
	lr := get(t, "TryRLock after the writer left", first.NewRWMutex(name, nil).TryRLock)
	if lr.Token() <= lw.Token() {
		t.Fatalf("read grant's token %d <= the earlier write grant's %d", lr.Token(), lw.Token())
	}
	_ = lr.Unlock(context.Background())
}

// testRWExclusion mixes readers and writers from several clients: a writer
// is never inside with anyone, and tokens follow the rules of
// driver/kinds.go (every grant above every grant that ended before it).
func (s *suite) testRWExclusion(t *testing.T) {
	name := uniqueName(t)
	const perClient, rounds = 2, 4
	var (
		mu               sync.Mutex
		readers, writers int
		maxEnded         uint64
		grants, nWrites  int
		errOnce          sync.Once
		failure          error
		wg               sync.WaitGroup
	)
	fail := func(err error) { errOnce.Do(func() { failure = err }) }
	for ci := 0; ci < s.cfg.Clients; ci++ {
		c, _ := s.client(t, nil)
		for g := 0; g < perClient; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				rw := c.NewRWMutex(name, nil)
				for r := 0; r < rounds; r++ {
					write := r == g%rounds || rand.N(3) == 0
					f := rw.RLock
					if write {
						f = rw.Lock
					}
					// A reader may be granted together with others and come
					// back after one of them ended: it must exceed every
					// grant that ended before it asked. A writer is granted
					// only once every earlier grant ended, so it must exceed
					// every grant that ended before it came back.
					mu.Lock()
					endedBefore := maxEnded
					mu.Unlock()
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					l, err := f(ctx)
					cancel()
					if err != nil {
						fail(fmt.Errorf("write=%v: %w", write, err))
						return
					}
					mu.Lock()
					grants++
					if write {
						endedBefore = maxEnded
					}
					if l.Token() <= endedBefore {
						fail(fmt.Errorf("a %s grant's token %d <= %d, the token of a grant that ended before it", l.Kind(), l.Token(), endedBefore))
					}
					if write {
						nWrites++
						writers++
						if writers != 1 || readers != 0 {
							fail(fmt.Errorf("a writer is inside with %d writers and %d readers", writers, readers))
						}
					} else {
						readers++
						if writers != 0 {
							fail(fmt.Errorf("a reader is inside with %d writers", writers))
						}
					}
					mu.Unlock()
					pause := time.NewTimer(time.Duration(rand.N(3)) * time.Millisecond) // pace the load
					<-pause.C
					mu.Lock()
					if write {
						writers--
					} else {
						readers--
					}
					maxEnded = max(maxEnded, l.Token())
					mu.Unlock()
					if err := l.Unlock(context.Background()); err != nil {
						fail(fmt.Errorf("unlock: %w", err))
						return
					}
				}
			}(g)
		}
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	if want := s.cfg.Clients * perClient * rounds; grants != want {
		t.Fatalf("%d grants, want %d", grants, want)
	}
	t.Logf("%d grants, %d of them writes", grants, nWrites)
}

type grantResult struct {
	l   *dlock.Lease
	err error
}

// waitIn starts f in a goroutine with a timeout and returns its result.
func waitIn(f acquireFunc, ctx context.Context) <-chan grantResult {
	ch := make(chan grantResult, 1)
	go func() {
		l, err := f(ctx)
		ch <- grantResult{l, err}
	}()
	return ch
}

// notGranted checks that a waiting call stays waiting for d (has not
// returned yet, when d is 0).
func notGranted(t testing.TB, ch <-chan grantResult, d time.Duration, what string) {
	t.Helper()
	var r grantResult
	if d == 0 {
		select {
		case r = <-ch:
		default:
			return
		}
	} else {
		select {
		case r = <-ch:
		case <-time.After(d):
			return
		}
	}
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	t.Fatalf("%s was granted (token %d); it must wait", what, r.l.Token())
}

// granted waits up to d for a waiting call's grant.
func granted(t testing.TB, ch <-chan grantResult, d time.Duration, what string) *dlock.Lease {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.l
	case <-time.After(d):
		t.Fatalf("%s: not granted within %v", what, d)
	}
	return nil
}

func (s *suite) testRWWriterPreference(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	c, _ := s.client(t, nil)
	name := uniqueName(t)
	la := get(t, "first reader's TryRLock", a.NewRWMutex(name, nil).TryRLock)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	writer := waitIn(b.NewRWMutex(name, nil).Lock, ctx)
	rc := c.NewRWMutex(name, nil)
	// Once the writer waits, new readers are refused while a reader holds.
	if !poll(10*time.Second+2*s.ttl(), func() bool { return refused(t, "TryRLock", rc.TryRLock) }) {
		t.Fatal("a new reader was still admitted 10s after a writer began to wait: no writer preference")
	}
	// The waiting writer keeps holding readers back for longer than its
	// TTL: its wait stays visible to the backend.
	until := time.Now().Add(2 * s.ttl())
	for time.Now().Before(until) {
		if !refused(t, "TryRLock", rc.TryRLock) {
			t.Fatal("a new reader was admitted while a writer still waited (the writer's wait was forgotten)")
		}
		pace := time.NewTimer(s.ttl() / 10)
		<-pace.C
	}
	notGranted(t, writer, 0, "the writer, while a reader holds")
	reader := waitIn(rc.RLock, ctx)
	notGranted(t, reader, s.ttl()/2, "a new reader's RLock while a writer waits")
	if la.Err() != nil {
		t.Fatalf("the first reader's lease ended while a writer waited: %v", la.Err())
	}
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("first reader's Unlock: %v", err)
	}
	lw := granted(t, writer, 10*s.ttl()+10*time.Second, "the waiting writer, once the reader left")
	if lw.Token() <= la.Token() {
		t.Fatalf("write token %d <= the earlier reader's %d", lw.Token(), la.Token())
	}
	notGranted(t, reader, s.ttl()/2, "the reader waiting behind the writer, while it writes")
	if err := lw.Unlock(context.Background()); err != nil {
		t.Fatalf("writer's Unlock: %v", err)
	}
	lr := granted(t, reader, 10*s.ttl()+10*time.Second, "the waiting reader, once the writer left")
	if lr.Token() <= lw.Token() {
		t.Fatalf("read token %d <= the earlier writer's %d", lr.Token(), lw.Token())
	}
	_ = lr.Unlock(context.Background())
}

// testRWWithdrawn: a writer that stops waiting no longer holds readers back.
func (s *suite) testRWWithdrawn(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	c, _ := s.client(t, nil)
	name := uniqueName(t)
	la := get(t, "first reader's TryRLock", a.NewRWMutex(name, nil).TryRLock)
	ctx, cancel := context.WithCancel(context.Background())
	writer := waitIn(b.NewRWMutex(name, nil).Lock, ctx)
	rc := c.NewRWMutex(name, nil)
	if !poll(10*time.Second+2*s.ttl(), func() bool { return refused(t, "TryRLock", rc.TryRLock) }) {
		cancel()
		t.Fatal("a new reader was still admitted 10s after a writer began to wait: no writer preference")
	}
	cancel()
	select {
	case r := <-writer:
		if r.err == nil {
			t.Fatalf("the writer was granted (token %d) while a reader held", r.l.Token())
		}
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled writer's Lock: %v, want context.Canceled", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled waiting writer did not return within 10s")
	}
	gaveUp := time.Now()
	lc := getWithin(t, "TryRLock after the waiting writer gave up", rc.TryRLock, 3*s.ttl()+10*time.Second)
	t.Logf("readers admitted %v after the writer gave up (TTL %v)", time.Since(gaveUp).Round(time.Millisecond), s.ttl())
	_ = lc.Unlock(context.Background())
	_ = la.Unlock(context.Background())
}

func (s *suite) testRWLoss(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	r1 := get(t, "TryRLock", a.NewRWMutex(name, nil).TryRLock)
	r2 := get(t, "TryRLock", b.NewRWMutex(name, nil).TryRLock)
	s.dropKind(t, name, driver.Read)
	s.lost(t, "read lease", r1)
	s.lost(t, "second read lease", r2)
	w := getWithin(t, "TryLock after the readers were dropped", a.NewRWMutex(name, nil).TryLock, 3*s.ttl()+10*time.Second)
	if w.Token() <= r2.Token() {
		t.Fatalf("write token %d <= a dropped reader's %d", w.Token(), r2.Token())
	}
	s.dropKind(t, name, driver.Write)
	s.lost(t, "write lease", w)
	r3 := getWithin(t, "TryRLock after the writer was dropped", b.NewRWMutex(name, nil).TryRLock, 3*s.ttl()+10*time.Second)
	if r3.Token() <= w.Token() {
		t.Fatalf("read token %d <= the dropped writer's %d", r3.Token(), w.Token())
	}
	_ = r3.Unlock(context.Background())
}

func (s *suite) testRWKilledReader(t *testing.T) {
	a, killA := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := get(t, "TryRLock", a.NewRWMutex(name, nil).TryRLock)
	killA()
	killed := time.Now()
	rw := b.NewRWMutex(name, nil)
	busy(t, "TryLock while a crashed reader's lease lives", rw.TryLock)
	lw := waitFor(t, "Lock after the reader crashed", rw.Lock, 20*s.ttl()+10*time.Second)
	t.Logf("writer granted %v after the reader crashed (TTL %v)", time.Since(killed).Round(time.Millisecond), s.ttl())
	if lw.Token() <= la.Token() {
		t.Fatalf("write token %d <= the crashed reader's %d", lw.Token(), la.Token())
	}
	_ = lw.Unlock(context.Background())
	within(t, la.Done(), 3*s.ttl()+5*time.Second, "crashed reader's Done")
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("crashed reader's Err = %v, want ErrLeaseLost", la.Err())
	}
}
