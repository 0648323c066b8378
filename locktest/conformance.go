package locktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// suite carries one harness through the subtests.
type suite struct {
	h   Harness
	cfg Config
}

func (s *suite) ttl() time.Duration { return s.cfg.TTL }

// RunConformanceTests runs the whole conformance suite against the backend
// newHarness connects to. Each subtest uses lock names of its own, so the
// subtests can share one server.
func RunConformanceTests(t *testing.T, newHarness NewHarness) {
	t.Helper()
	ctx := context.Background()
	h, err := newHarness(ctx, t)
	if err != nil {
		t.Fatalf("locktest: harness: %v", err)
	}
	t.Cleanup(h.Close)
	cfg := h.Config()
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	if cfg.Clients == 0 {
		cfg.Clients = 3
	}
	s := &suite{h: h, cfg: cfg}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"LockUnlock", s.testLockUnlock},
		{"TryLockHeld", s.testTryLockHeld},
		{"MutualExclusion", s.testMutualExclusion},
		{"HandOffOnRelease", s.testHandOff},
		{"ReleaseFreesAtOnce", s.testReleaseFreesAtOnce},
		{"CrashedHolderExpires", s.testCrashedHolderExpires},
		{"LockDelay", s.testLockDelay},
		{"OwnerOnly", s.testOwnerOnly},
		{"LossSignalledOnDrop", s.testLossOnDrop},
		{"RenewalKeepsLease", s.testRenewalKeepsLease},
		{"ExtendAndNoRenew", s.testExtend},
		{"CancelWaitingLeavesNothing", s.testCancelWaiting},
		{"Reentrancy", s.testReentrancy},
		{"CloseReleases", s.testCloseReleases},
		{"Do", s.testDo},
		{"Inspect", s.testInspect},
		{"InvalidInput", s.testInvalidInput},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

// uniqueName returns a lock name no other subtest or run uses.
func uniqueName(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return "locktest/" + n + "-" + hex.EncodeToString(b[:])
}

// client opens a new client (a separate "process") and closes it at cleanup.
func (s *suite) client(t testing.TB, opts *dlock.Options) (*dlock.Client, func()) {
	t.Helper()
	d, err := s.h.NewDriver(context.Background())
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	if opts == nil {
		opts = &dlock.Options{}
	}
	if opts.TTL == 0 {
		opts.TTL = s.ttl()
	}
	if opts.WaitMax == 0 {
		opts.WaitMax = 100 * time.Millisecond
	}
	c := dlock.New(d, opts)
	t.Cleanup(func() { _ = c.Close() })
	kill := func() {
		if err := s.h.Kill(d); err != nil {
			t.Errorf("Kill: %v", err)
		}
	}
	return c, kill
}

// within waits for ch to close, failing the test after d.
func within(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

// stays checks that ch stays open for d.
func stays(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: closed within %v", what, d)
	case <-time.After(d):
	}
}

func mustLock(t testing.TB, m *dlock.Mutex, timeout time.Duration) *dlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock(%q): %v", m.Name(), err)
	}
	return l
}

func mustTry(t testing.TB, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	l, err := m.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock(%q): %v", m.Name(), err)
	}
	return l
}

func wantLocked(t testing.TB, m *dlock.Mutex) {
	t.Helper()
	l, err := m.TryLock(context.Background())
	if err == nil {
		_ = l.Unlock(context.Background())
		t.Fatalf("TryLock(%q) succeeded on a held lock (token %d)", m.Name(), l.Token())
	}
	if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock(%q) on a held lock: got %v, want ErrLocked", m.Name(), err)
	}
}

// tryUntil calls TryLock until it succeeds or d passes.
func tryUntil(t testing.TB, m *dlock.Mutex, d time.Duration) *dlock.Lease {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l, err := m.TryLock(context.Background())
		if err == nil {
			return l
		}
		if !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("TryLock(%q): %v", m.Name(), err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryLock(%q) still locked after %v", m.Name(), d)
		}
		wait := time.NewTimer(5 * time.Millisecond)
		<-wait.C
	}
}

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

func (s *suite) testCrashedHolderExpires(t *testing.T) {
	a, killA := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	killA()
	killed := time.Now()
	mb := b.NewMutex(name, nil)
	wantLocked(t, mb)
	lb := mustLock(t, mb, 20*s.ttl()+10*time.Second)
	if lb.Token() <= la.Token() {
		t.Fatalf("token after a crashed holder %d <= the crashed holder's %d", lb.Token(), la.Token())
	}
	t.Logf("lock freed %v after the holder crashed (TTL %v)", time.Since(killed).Round(time.Millisecond), s.ttl())
	_ = lb.Unlock(context.Background())
	// The crashed holder's lease is lost locally too (its client cannot renew).
	within(t, la.Done(), 3*s.ttl()+5*time.Second, "crashed holder's Done")
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("crashed holder's Err = %v, want ErrLeaseLost", la.Err())
	}
}

func (s *suite) testLockDelay(t *testing.T) {
	a, killA := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	delay := 2 * s.ttl()
	m := a.NewMutex(name, &dlock.MutexOptions{LockDelay: delay})
	if !s.cfg.LockDelay {
		_, err := m.TryLock(context.Background())
		if !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("TryLock with LockDelay on a backend without it: %v, want ErrUnsupported", err)
		}
		return
	}
	la := mustTry(t, m)
	killA()
	killed := time.Now()
	lb := tryUntil(t, b.NewMutex(name, nil), 20*s.ttl()+delay+10*time.Second)
	waited := time.Since(killed)
	// The lease could only have expired TTL after it was granted, and the
	// delay runs from then: allow for the time between grant and kill.
	if waited < delay {
		t.Fatalf("lock taken %v after the holder crashed; lock-delay %v was not honoured", waited, delay)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d <= crashed holder's %d", lb.Token(), la.Token())
	}
	_ = lb.Unlock(context.Background())
}

func (s *suite) testOwnerOnly(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	if err := s.h.Drop(context.Background(), name); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	mb := b.NewMutex(name, nil)
	lb := tryUntil(t, mb, 10*s.ttl()+10*time.Second)
	// The stale holder must not be able to touch the new holder's lock.
	if err := la.Extend(context.Background(), s.ttl()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("stale Extend = %v, want ErrNotHeld", err)
	}
	if err := la.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("stale Unlock = %v, want ErrNotHeld", err)
	}
	if lb.Err() != nil {
		t.Fatalf("new holder's lease ended after a stale Unlock: %v", lb.Err())
	}
	wantLocked(t, a.NewMutex(name, nil))
	if lb.Token() <= la.Token() {
		t.Fatalf("new holder's token %d <= stale holder's %d", lb.Token(), la.Token())
	}
	if err := lb.Unlock(context.Background()); err != nil {
		t.Fatalf("new holder's Unlock: %v", err)
	}
}

func (s *suite) testLossOnDrop(t *testing.T) {
	a, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	if err := s.h.Drop(context.Background(), name); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	within(t, la.Done(), 3*s.ttl()+5*time.Second, "Done after the server dropped the lease")
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err = %v, want ErrLeaseLost", la.Err())
	}
	if !errors.Is(context.Cause(la.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("context.Cause(Context) = %v, want ErrLeaseLost", context.Cause(la.Context()))
	}
	if err := la.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock after loss = %v, want ErrNotHeld", err)
	}
}

func (s *suite) testRenewalKeepsLease(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	stays(t, la.Done(), 3*s.ttl(), "Done of a renewed lease")
	wantLocked(t, b.NewMutex(name, nil))
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock after renewals: %v", err)
	}
}

func (s *suite) testExtend(t *testing.T) {
	if s.cfg.SessionBound {
		t.Skip("session-bound backend: a lease lives as long as its session")
	}
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, &dlock.MutexOptions{RenewInterval: -1}))
	if err := la.Extend(context.Background(), 4*s.ttl()); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	stays(t, la.Done(), 2*s.ttl(), "Done of an extended lease")
	wantLocked(t, b.NewMutex(name, nil))
	// Without renewal the lease ends on its own, and loss is signalled.
	within(t, la.Done(), 6*s.ttl()+5*time.Second, "Done of an unrenewed lease")
	if !errors.Is(la.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("Err of an expired lease = %v, want ErrLeaseLost", la.Err())
	}
	lb := tryUntil(t, b.NewMutex(name, nil), 5*s.ttl()+5*time.Second)
	_ = lb.Unlock(context.Background())
	if err := la.Extend(context.Background(), 0); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Extend(0) = %v, want ErrInvalid", err)
	}
}

func (s *suite) testCancelWaiting(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	c, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	for _, cancelFirst := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), s.ttl()/2)
		if cancelFirst {
			cancel()
		}
		_, err := b.NewMutex(name, nil).Lock(ctx)
		cancel()
		if err == nil {
			t.Fatal("Lock on a held lock returned without error")
		}
		if !errors.Is(err, ctx.Err()) {
			t.Fatalf("cancelled Lock = %v, want an error wrapping %v", err, ctx.Err())
		}
		if errors.Is(err, dlock.ErrLeaseLost) || errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("cancelled Lock = %v: must be told apart from loss or ErrLocked", err)
		}
	}
	if err := la.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	// The cancelled waiters left no queue entry or key behind: the lock is
	// free at once.
	lc := mustTry(t, c.NewMutex(name, nil))
	_ = lc.Unlock(context.Background())
	if infos, err := c.Inspect(context.Background(), name); err == nil {
		for _, in := range infos {
			if in.Name == name && (in.Count != 0 || in.Waiters > 0) {
				t.Fatalf("after cancelled waiters: %+v", in)
			}
		}
	}
}

func (s *suite) testReentrancy(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	owner := "locktest-owner-" + name[len(name)-8:]
	opts := &dlock.MutexOptions{Owner: owner}
	l1 := mustTry(t, a.NewMutex(name, opts))
	l2 := mustTry(t, a.NewMutex(name, opts))
	if l2.Token() != l1.Token() {
		t.Fatalf("re-entered token %d != first %d", l2.Token(), l1.Token())
	}
	if l2.Count() != 2 {
		t.Fatalf("re-entered Count = %d, want 2", l2.Count())
	}
	if l1.Owner() != owner {
		t.Fatalf("Owner() = %q, want %q", l1.Owner(), owner)
	}
	wantLocked(t, b.NewMutex(name, nil))
	if err := l2.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock of the inner hold: %v", err)
	}
	wantLocked(t, b.NewMutex(name, nil)) // still held once
	if l1.Err() != nil {
		t.Fatalf("outer hold ended with the inner: %v", l1.Err())
	}
	if err := l1.Unlock(context.Background()); err != nil {
		t.Fatalf("Unlock of the outer hold: %v", err)
	}
	lb := mustTry(t, b.NewMutex(name, nil))
	if lb.Token() <= l1.Token() {
		t.Fatalf("token %d <= %d", lb.Token(), l1.Token())
	}
	_ = lb.Unlock(context.Background())
}

func (s *suite) testCloseReleases(t *testing.T) {
	d, err := s.h.NewDriver(context.Background())
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	a := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
	b, _ := s.client(t, nil)
	base := uniqueName(t)
	var leases []*dlock.Lease
	for i := 0; i < 3; i++ {
		leases = append(leases, mustTry(t, a.NewMutex(fmt.Sprintf("%s-%d", base, i), nil)))
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, l := range leases {
		within(t, l.Done(), time.Second, "Done after Close")
		if !errors.Is(l.Err(), dlock.ErrClosed) {
			t.Fatalf("Err after Close = %v, want ErrClosed", l.Err())
		}
		lb := mustTry(t, b.NewMutex(fmt.Sprintf("%s-%d", base, i), nil)) // freed at once
		_ = lb.Unlock(context.Background())
	}
	if _, err := a.NewMutex(base, nil).TryLock(context.Background()); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("TryLock after Close = %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close = %v, want the first's result", err)
	}
}

func (s *suite) testDo(t *testing.T) {
	a, _ := s.client(t, nil)
	b, _ := s.client(t, nil)
	name := uniqueName(t)
	sentinel := errors.New("work failed")
	var token uint64
	err := a.Do(context.Background(), name, nil, func(ctx context.Context, l *dlock.Lease) error {
		token = l.Token()
		wantLocked(t, b.NewMutex(name, nil))
		return sentinel
	})
	if !errors.Is(err, sentinel) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if token == 0 {
		t.Fatal("Do did not run fn with a lease")
	}
	lb := mustTry(t, b.NewMutex(name, nil)) // Do released it
	_ = lb.Unlock(context.Background())
}

func (s *suite) testInspect(t *testing.T) {
	a, _ := s.client(t, nil)
	name := uniqueName(t)
	la := mustTry(t, a.NewMutex(name, nil))
	infos, err := a.Inspect(context.Background(), name)
	if errors.Is(err, dlock.ErrUnsupported) {
		t.Skip("backend cannot list locks")
	}
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	found := false
	for _, in := range infos {
		if in.Name == name {
			found = true
			if in.Count < 1 || in.Token != la.Token() {
				t.Fatalf("Inspect of a held lock = %+v, want count >= 1 and token %d", in, la.Token())
			}
		}
	}
	if !found {
		t.Fatalf("Inspect(%q) = %+v: held lock missing", name, infos)
	}
	_ = la.Unlock(context.Background())
}

func (s *suite) testInvalidInput(t *testing.T) {
	a, _ := s.client(t, nil)
	name := uniqueName(t)
	cases := []struct {
		arg  string
		name string
		opts *dlock.MutexOptions
	}{
		{"name", "", nil},
		{"name", strings.Repeat("x", 256), nil},
		{"name", "bad\x00name", nil},
		{"name", "bad\nname", nil},
		{"name", "bad\xffutf8", nil},
		{"Owner", name, &dlock.MutexOptions{Owner: "has space"}},
		{"Owner", name, &dlock.MutexOptions{Owner: strings.Repeat("o", 129)}},
		{"TTL", name, &dlock.MutexOptions{TTL: -time.Second}},
		{"TTL", name, &dlock.MutexOptions{TTL: time.Nanosecond}},
		{"RenewInterval", name, &dlock.MutexOptions{TTL: time.Second, RenewInterval: 2 * time.Second}},
		{"WaitMax", name, &dlock.MutexOptions{WaitMin: time.Second, WaitMax: time.Millisecond}},
		{"LockDelay", name, &dlock.MutexOptions{LockDelay: 100000 * time.Hour}},
	}
	for _, tc := range cases {
		for _, wait := range []bool{false, true} {
			m := a.NewMutex(tc.name, tc.opts)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var err error
			if wait {
				_, err = m.Lock(ctx)
			} else {
				_, err = m.TryLock(ctx)
			}
			cancel()
			var ie *dlock.InvalidArgumentError
			if !errors.Is(err, dlock.ErrInvalid) || !errors.As(err, &ie) {
				t.Fatalf("name %q opts %+v: got %v, want an invalid-argument error", tc.name, tc.opts, err)
			}
			if ie.Arg != tc.arg {
				t.Fatalf("name %q opts %+v: error names %q, want %q (%v)", tc.name, tc.opts, ie.Arg, tc.arg, err)
			}
		}
	}
	// A valid name with unusual characters works and does not collide.
	odd := []string{name + "/a{b}c", name + "/a_b_c", name + "/ä ü 😀", name + "/a:b"}
	var held []*dlock.Lease
	for _, n := range odd {
		held = append(held, mustTry(t, a.NewMutex(n, nil)))
	}
	for _, l := range held {
		if err := l.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock(%q): %v", l.Name(), err)
		}
	}
}
