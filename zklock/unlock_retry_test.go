package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
)

// TestUnlockRetriedAfterConnectionCut (audit finding 3, through the dlock
// package): the connection is cut while Unlock runs, so Unlock fails with
// its outcome unknown; the connection comes back while the session lives.
// The dlock Client retries the release in the background, so another client
// gets the lock soon after, while the first client's session, which would
// otherwise keep the node for as long as it lives, is still alive (its other
// lease is still held).
func TestUnlockRetriedAfterConnectionCut(t *testing.T) {
	const session = 4 * time.Second
	hi, err := newHarness(1)(context.Background(), t)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	h := hi.(*harness)
	defer h.Close()
	dd, err := h.NewDriver(context.Background())
	if err != nil {
		t.Fatalf("NewDriver: %v", err)
	}
	d, _ := unwrap(dd)
	a := dlock.New(d, &dlock.Options{TTL: session, ReleaseTimeout: 300 * time.Millisecond, WaitMax: 100 * time.Millisecond})
	defer a.Close()
	b := dlock.New(newTestDriver(t, h.endpoints, nil), &dlock.Options{TTL: session})
	defer b.Close()

	name := locktestName(t)
	la, err := a.NewMutex(name, nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	other, err := a.NewMutex(name+"-other", nil).TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}

	h.mu.Lock()
	ps := h.proxies[d]
	h.mu.Unlock()
	for _, p := range ps {
		p.close()
	}
	if err := la.Unlock(context.Background()); err == nil {
		t.Fatal("Unlock succeeded with the connection cut: the test did not set up what it means to")
	}
	var back []*proxy
	for _, p := range ps {
		np, err := newProxyAt(p.addr(), p.target)
		if err != nil {
			t.Fatalf("proxy back at %s: %v", p.addr(), err)
		}
		back = append(back, np)
	}
	h.mu.Lock()
	h.proxies[d] = back
	h.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 4*session)
	defer cancel()
	lb, err := b.NewMutex(name, nil).Lock(ctx)
	if err != nil {
		t.Fatalf("the lock given up by a failed Unlock was not granted to another client within %v: %v", 4*session, err)
	}
	defer lb.Unlock(context.Background())
	if err := other.Err(); err != nil {
		t.Fatalf("the first client's session ended (%v): the lock was freed by the session's end, not by the retried release", err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d <= %d", lb.Token(), la.Token())
	}
	if err := other.Unlock(context.Background()); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of the other lease: %v", err)
	}
}

// locktestName is a lock name of this test's own.
func locktestName(t *testing.T) string {
	return "unlock-retry/" + t.Name() + "-" + time.Now().Format("150405.000000")
}
