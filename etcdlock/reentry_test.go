package etcdlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
)

// A re-entry whose check wrongly reports the grant gone (as a stale read did
// on a 3-member cluster) is still granted, on the same key with the same
// token and a count of 2: the fresh enqueue finds its own grant at the head
// of the queue and removes its new key instead of queueing behind it (it
// returned ErrLocked, or waited for its own grant).
func TestReentryAfterAWrongCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wait  bool
		delay time.Duration
	}{
		{"TryAcquire", false, 0},
		{"Acquire with lock-delay", true, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := newClient(t, shared.Endpoints())
			d := newTestDriver(t, cli, nil)
			var wrong atomic.Bool
			d.testCheck = func(_ *handle, ok bool) bool { return ok && !wrong.Swap(false) }
			name := "reentry-wrong-check-" + t.Name()
			req := driver.AcquireRequest{Name: name, Owner: "o", TTL: 10 * time.Second, LockDelay: tc.delay}
			acquire := d.TryAcquire
			if tc.wait {
				acquire = d.Acquire
			}
			g1, err := d.TryAcquire(queuetest.Ctx(t, 10*time.Second), req)
			if err != nil {
				t.Fatal(err)
			}
			wrong.Store(true)
			g2, err := acquire(queuetest.Ctx(t, 10*time.Second), req)
			if err != nil {
				t.Fatalf("re-entry after a wrong check: %v", err)
			}
			if wrong.Load() {
				t.Fatal("the re-entry made no check")
			}
			if g2.Count != 2 || g2.Token != g1.Token || g2.Handle != g1.Handle {
				t.Fatalf("re-entry after a wrong check: count %d token %d (first %d), same handle %v; want count 2 on the first grant",
					g2.Count, g2.Token, g1.Token, g2.Handle == g1.Handle)
			}
			if ks := keys(t, cli, d.queuePrefix(name)); len(ks) != 1 || ks[0] != g1.Handle.(*handle).key {
				t.Fatalf("queue after the re-entry: %q; want only the grant's key", ks)
			}
			l := queuetest.Lease(name, "o", g1)
			l.LockDelay = tc.delay
			for want := 1; want >= 0; want-- {
				if n, err := d.Release(queuetest.Ctx(t, 5*time.Second), l); err != nil || n != want {
					t.Fatalf("Release = %d, %v; want %d", n, err, want)
				}
			}
			other := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
			g3, err := other.TryAcquire(queuetest.Ctx(t, 5*time.Second), queuetest.Req(name, "p"))
			if err != nil {
				t.Fatalf("after both releases: %v", err)
			}
			if g3.Token <= g1.Token {
				t.Fatalf("token %d <= %d", g3.Token, g1.Token)
			}
		})
	}
}

// The check of a re-entry is decided by the cluster, not by the member the
// client happens to ask: on a member cut off from the quorum it fails rather
// than confirm the grant from the member's own, possibly stale, copy. (It
// was an etcd transaction without operations, which etcd serves as a
// serializable read: a follower that had not yet applied the grant's put
// reported it gone, and the re-entry was refused with ErrLocked.)
func TestReentryCheckIsLinearizable(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster: skipped in -short mode")
	}
	c := testserver.Etcd(t, 3)
	d := newTestDriver(t, newClient(t, []string{c.Members[0].Addr()}), nil)
	g, err := d.TryAcquire(queuetest.Ctx(t, 10*time.Second), driver.AcquireRequest{Name: "reentry-linearizable", Owner: "o", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members[1:] {
		if err := m.Pause(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Resume() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	ok, _, err := d.stillHeld(ctx, g.Handle.(*handle))
	if err == nil {
		t.Fatalf("check on a member without quorum = %v, nil; want an error (the member answered from its own copy)", ok)
	}
	for _, m := range c.Members[1:] {
		if err := m.Resume(); err != nil {
			t.Fatal(err)
		}
	}
}
