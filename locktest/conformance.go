package locktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
)

// suite carries one harness through the subtests.
type suite struct {
	h     Harness
	cfg   Config
	kinds map[driver.Kind]bool // the kinds the driver supports (driver.Kinder)
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
	s := &suite{h: h, cfg: cfg, kinds: supportedKinds(t, h)}
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
		{"RWMutex", s.testRWMutex},
		{"Semaphore", s.testSemaphore},
		{"MultiMutex", s.testMultiMutex},
		{"InvalidInput", s.testInvalidInput},
		{"NoLeakAfterClose", s.testNoLeaks},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

// supportedKinds asks one driver which lock kinds it supports.
func supportedKinds(t *testing.T, h Harness) map[driver.Kind]bool {
	t.Helper()
	d, err := h.NewDriver(context.Background())
	if err != nil {
		t.Fatalf("locktest: NewDriver: %v", err)
	}
	kinds := map[driver.Kind]bool{driver.Exclusive: true}
	if kd, ok := d.(driver.Kinder); ok {
		for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
			kinds[k] = kd.SupportsKind(k)
		}
	}
	_ = dlock.New(d, nil).Close()
	return kinds
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

// tryUntil calls TryLock until it succeeds or d passes. An attempt that
// timed out (see timedOut) is tried again like a refusal; any other error
// fails the test.
func tryUntil(t testing.TB, m *dlock.Mutex, d time.Duration) *dlock.Lease {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		l, err := m.TryLock(context.Background())
		if err == nil {
			return l
		}
		if !errors.Is(err, dlock.ErrLocked) && !timedOut(err) {
			t.Fatalf("TryLock(%q): %v", m.Name(), err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryLock(%q) still locked after %v (last: %v)", m.Name(), d, err)
		}
		wait := time.NewTimer(5 * time.Millisecond)
		<-wait.C
	}
}

// timedOut reports whether err is a timeout: the backend, or too many of a
// quorum's nodes, did not answer within the driver's own deadline. On a
// loaded machine a process that is not scheduled for longer than a node
// timeout (400 ms in quorum's tests) sees that now and then, and a test
// that polls TryLock for seconds makes hundreds of attempts.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}
