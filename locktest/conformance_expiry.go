package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

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
