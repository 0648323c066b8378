package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// acquireFunc is one of the lock types' acquire methods (TryRLock, Lock,
// TryAcquire, …) bound to its lock.
type acquireFunc func(ctx context.Context) (*dlock.Lease, error)

// get makes one attempt and fails t unless it is granted.
func get(t testing.TB, what string, f acquireFunc) *dlock.Lease {
	t.Helper()
	l, err := f(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return l
}

// waitFor waits up to timeout for a grant and fails t otherwise.
func waitFor(t testing.TB, what string, f acquireFunc, timeout time.Duration) *dlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	l, err := f(ctx)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return l
}

// busy makes one attempt and fails t unless it is refused with ErrLocked.
func busy(t testing.TB, what string, f acquireFunc) {
	t.Helper()
	l, err := f(context.Background())
	if err == nil {
		_ = l.Unlock(context.Background())
		t.Fatalf("%s succeeded (token %d); want ErrLocked", what, l.Token())
	}
	if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("%s: got %v, want ErrLocked", what, err)
	}
}

// refused reports whether one attempt is refused with ErrLocked (a grant is
// given back at once); any other error fails t.
func refused(t testing.TB, what string, f acquireFunc) bool {
	t.Helper()
	l, err := f(context.Background())
	if err == nil {
		_ = l.Unlock(context.Background())
		return false
	}
	if !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("%s: %v", what, err)
	}
	return true
}

// getWithin retries one-shot attempts until one is granted or d passes.
func getWithin(t testing.TB, what string, f acquireFunc, d time.Duration) *dlock.Lease {
	t.Helper()
	var l *dlock.Lease
	ok := poll(d, func() bool {
		var err error
		l, err = f(context.Background())
		if err != nil && !errors.Is(err, dlock.ErrLocked) {
			t.Fatalf("%s: %v", what, err)
		}
		return err == nil
	})
	if !ok {
		t.Fatalf("%s: still refused after %v", what, d)
	}
	return l
}

// unsupported checks that f fails at once with ErrUnsupported.
func unsupported(t testing.TB, what string, f acquireFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := f(ctx)
	if err == nil {
		_ = l.Unlock(context.Background())
		t.Fatalf("%s was granted (a %s lease) on a backend whose driver does not support the kind; want ErrUnsupported", what, l.Kind())
	}
	if !errors.Is(err, dlock.ErrUnsupported) {
		t.Fatalf("%s on a backend without the kind: %v, want ErrUnsupported", what, err)
	}
}

// lost waits for l to be lost and checks how loss is signalled.
func (s *suite) lost(t testing.TB, what string, l *dlock.Lease) {
	t.Helper()
	within(t, l.Done(), 3*s.ttl()+5*time.Second, what+": Done after the server dropped the grant")
	if !errors.Is(l.Err(), dlock.ErrLeaseLost) {
		t.Fatalf("%s: Err = %v, want ErrLeaseLost", what, l.Err())
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLeaseLost) {
		t.Fatalf("%s: context.Cause(Context) = %v, want ErrLeaseLost", what, context.Cause(l.Context()))
	}
	if err := l.Unlock(context.Background()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("%s: Unlock after loss = %v, want ErrNotHeld", what, err)
	}
}

// dropKind drops the grants of kind k on name through the harness.
func (s *suite) dropKind(t testing.TB, name string, k driver.Kind) {
	t.Helper()
	kd, ok := s.h.(KindDropper)
	if !ok {
		t.Fatalf("locktest: the driver supports %s grants, so the harness must implement locktest.KindDropper", k)
	}
	if err := kd.DropKind(context.Background(), name, k); err != nil {
		t.Fatalf("DropKind(%q, %s): %v", name, k, err)
	}
}

// runAll runs named subtests.
func runAll(t *testing.T, tests []struct {
	name string
	fn   func(t *testing.T)
}) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}
