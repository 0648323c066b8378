package locktest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

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
