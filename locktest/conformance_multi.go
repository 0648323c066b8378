package locktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// testMultiMutex is the MultiMutex section. Every backend runs it: a
// MultiMutex needs no capability (drivers with driver.MultiAcquirer take
// the names in one round trip, the others one by one).
func (s *suite) testMultiMutex(t *testing.T) {
	runAll(t, []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"AllOrNothing", s.testMultiAllOrNothing},
		{"NoDeadlock", s.testMultiNoDeadlock},
		{"LossOfOnePart", s.testMultiLoss},
	})
}

func (s *suite) testMultiAllOrNothing(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	base := uniqueName(t)
	names := []string{base + "/c", base + "/a", base + "/b"}
	for _, bad := range [][]string{nil, {base + "/a", base + "/a"}, {base + "/a", ""}} {
		if _, err := a.NewMultiMutex(bad, nil).TryLock(context.Background()); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock of a MultiMutex over %q: %v, want ErrInvalid", bad, err)
		}
	}
	mm := a.NewMultiMutex(names, nil)
	lb := mustTry(t, b.NewMutex(names[2], nil)) // the middle name, base/b
	if ml, err := mm.TryLock(context.Background()); !errors.Is(err, dlock.ErrLocked) {
		if ml != nil {
			_ = ml.Unlock(context.Background())
		}
		t.Fatalf("TryLock with one name held: %v, want ErrLocked", err)
	}
	// Nothing was left held: the other names are free.
	for _, n := range []string{names[0], names[1]} {
		l := mustTry(t, b.NewMutex(n, nil))
		_ = l.Unlock(context.Background())
	}
	// A waiting Lock gets every name once the busy one is released.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	got := make(chan *dlock.MultiLease, 1)
	errc := make(chan error, 1)
	go func() {
		ml, err := mm.Lock(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- ml
	}()
	select {
	case ml := <-got:
		t.Fatalf("Lock granted (tokens %v) while a name was held", ml.Tokens())
	case err := <-errc:
		t.Fatalf("Lock: %v", err)
	case <-time.After(s.ttl() / 2):
	}
	if err := lb.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	var ml *dlock.MultiLease
	select {
	case ml = <-got:
	case err := <-errc:
		t.Fatalf("Lock: %v", err)
	case <-time.After(10*s.ttl() + 10*time.Second):
		t.Fatal("Lock not granted after the busy name was released")
	}
	sorted := slices.Sorted(slices.Values(names))
	if !slices.Equal(ml.Names(), sorted) {
		t.Fatalf("Names() = %q, want %q (sorted)", ml.Names(), sorted)
	}
	toks := ml.Tokens()
	if len(toks) != 3 || ml.Token() != slices.Max(toks) || slices.Contains(toks, 0) {
		t.Fatalf("Tokens() = %v, Token() = %d: want 3 positive tokens and their largest", toks, ml.Token())
	}
	if toks[1] <= lb.Token() {
		t.Fatalf("token of %q %d <= its previous holder's %d", sorted[1], toks[1], lb.Token())
	}
	if ml.ValidFor() <= 0 || ml.Err() != nil {
		t.Fatalf("held MultiLease: ValidFor %v, Err %v", ml.ValidFor(), ml.Err())
	}
	// Each part is the Mutex of its name.
	for _, n := range names {
		wantLocked(t, b.NewMutex(n, nil))
	}
	if _, err := b.NewMultiMutex([]string{base + "/z", names[0]}, nil).TryLock(context.Background()); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock of an overlapping MultiMutex: %v, want ErrLocked", err)
	}
	l := mustTry(t, b.NewMutex(base+"/z", nil)) // left free by the refused overlapping set
	_ = l.Unlock(context.Background())
	if err := ml.Unlock(context.Background()); err != nil {
		t.Fatalf("MultiLease Unlock: %v", err)
	}
	within(t, ml.Done(), time.Second, "Done after Unlock")
	if !errors.Is(ml.Err(), dlock.ErrReleased) {
		t.Fatalf("Err after Unlock = %v, want ErrReleased", ml.Err())
	}
	if err := ml.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
	}
	for _, n := range names {
		l := mustTry(t, b.NewMutex(n, nil))
		_ = l.Unlock(context.Background())
	}
}

// testMultiNoDeadlock: random overlapping sets from several clients, each
// given in random order, all complete within a deadline, and no name is
// ever held twice.
func (s *suite) testMultiNoDeadlock(t *testing.T) {
	base := uniqueName(t)
	pool := []string{base + "/0", base + "/1", base + "/2", base + "/3", base + "/4"}
	const perClient, rounds = 2, 4
	var (
		mu      sync.Mutex
		holders = map[string]int{}
		grants  int
		errOnce sync.Once
		failure error
		wg      sync.WaitGroup
	)
	fail := func(err error) { errOnce.Do(func() { failure = err }) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for ci := 0; ci < s.cfg.Clients; ci++ {
		c, _ := s.client(t, nil)
		for g := 0; g < perClient; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					set := slices.Clone(pool)
					rand.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
					set = set[:2+rand.N(2)]
					ml, err := c.NewMultiMutex(set, nil).Lock(ctx)
					if err != nil {
						fail(fmt.Errorf("lock(%q): %w (a deadlock ends at the test's deadline)", set, err))
						return
					}
					mu.Lock()
					grants++
					for _, n := range set {
						if holders[n]++; holders[n] != 1 {
							fail(fmt.Errorf("%q held by %d MultiLeases at once", n, holders[n]))
						}
					}
					mu.Unlock()
					pause := time.NewTimer(time.Duration(rand.N(3)) * time.Millisecond) // pace the load
					<-pause.C
					mu.Lock()
					for _, n := range set {
						holders[n]--
					}
					mu.Unlock()
					if err := ml.Unlock(context.Background()); err != nil {
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
	if want := s.cfg.Clients * perClient * rounds; grants != want {
		t.Fatalf("%d grants, want %d", grants, want)
	}
}

// testMultiLoss: losing one part ends the MultiLease, and the other parts
// are given up.
func (s *suite) testMultiLoss(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	base := uniqueName(t)
	names := []string{base + "/a", base + "/b"}
	ml, err := a.NewMultiMutex(names, nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := s.h.Drop(context.Background(), names[1]); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	within(t, ml.Done(), 3*s.ttl()+5*time.Second, "MultiLease Done after one part was dropped")
	if !errors.Is(ml.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", ml.Err())
	}
	if !errors.Is(context.Cause(ml.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("context.Cause(Context) = %v, want ErrLeaseLost", context.Cause(ml.Context()))
	}
	if ml.ValidFor() != 0 {
		t.Fatalf("ValidFor after loss = %v, want 0", ml.ValidFor())
	}
	if err := ml.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock after loss = %v, want ErrNotHeld", err)
	}
	// The part that was not lost is given up, not left until its TTL.
	la := tryUntil(t, b.NewMutex(names[0], nil), 10*time.Second)
	_ = la.Unlock(context.Background())
}
