package redislock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

func kreq(name, owner string, k driver.Kind) driver.AcquireRequest {
	r := driver.AcquireRequest{Name: name, Owner: owner, TTL: 10 * time.Second, Kind: k}
	if k == driver.Permit {
		r.Permits = 2
	}
	return r
}

func klease(req driver.AcquireRequest, g driver.Grant) driver.Lease {
	l := lease(req, g)
	l.Kind, l.Permits = req.Kind, req.Permits
	return l
}

func mustGrant(t *testing.T, d driver.Driver, req driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(ctxT(t), req)
	if err != nil {
		t.Fatalf("%s %s by %s: %v", req.Kind, req.Name, req.Owner, err)
	}
	return g
}

func mustRefuse(t *testing.T, d driver.Driver, req driver.AcquireRequest) *driver.LockedError {
	t.Helper()
	g, err := d.TryAcquire(ctxT(t), req)
	var le *driver.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("%s %s by %s: %+v, %v; want a LockedError", req.Kind, req.Name, req.Owner, g, err)
	}
	return le
}

func mustRelease(t *testing.T, d driver.Driver, l driver.Lease, want int) {
	t.Helper()
	n, err := d.Release(ctxT(t), l)
	if err != nil || n != want {
		t.Fatalf("release %s %s by %s: %d, %v; want %d", l.Kind, l.Name, l.Owner, n, err, want)
	}
}

// TestReadWriteRules: readers share; a writer excludes readers and writers
// and waits for the last reader; re-entry per side keeps the token; reads
// and writes share one counter, so every grant's token exceeds every
// earlier grant's; an upgrade (reader asks Write) is refused; the name's
// mutex and semaphore are other locks.
func TestReadWriteRules(t *testing.T) {
	f := newFixture(t)
	const name = "rw"
	r1, r2 := kreq(name, "r1", driver.Read), kreq(name, "r2", driver.Read)
	g1 := mustGrant(t, f.d, r1)
	g2 := mustGrant(t, f.d, r2)
	if g2.Token <= g1.Token {
		t.Fatalf("second reader's token %d <= first's %d", g2.Token, g1.Token)
	}
	if g := mustGrant(t, f.d, r1); g.Count != 2 || g.Token != g1.Token {
		t.Fatalf("read re-entry: %+v, want count 2 and token %d", g, g1.Token)
	}
	w := kreq(name, "w", driver.Write)
	le := mustRefuse(t, f.d, w)
	if le.RetryAfter < 9*time.Second || le.RetryAfter > 10*time.Second || le.Token != g2.Token {
		t.Fatalf("writer refused by readers: %+v, want RetryAfter ≈ 10s (the last reader's end), token %d", le, g2.Token)
	}
	mustRefuse(t, f.d, kreq(name, "r1", driver.Write)) // an upgrade waits like any writer
	// The name's mutex and semaphore are other locks.
	gm := mustGrant(t, f.d, kreq(name, "m", driver.Exclusive))
	gp := mustGrant(t, f.d, kreq(name, "p", driver.Permit))
	mustRelease(t, f.d, klease(r1, g1), 1)
	mustRelease(t, f.d, klease(r1, g1), 0)
	mustRefuse(t, f.d, w)
	mustRelease(t, f.d, klease(r2, g2), 0)
	gw := mustGrant(t, f.d, w)
	if gw.Token <= g2.Token {
		t.Fatalf("writer's token %d <= an earlier reader's %d", gw.Token, g2.Token)
	}
	if g := mustGrant(t, f.d, w); g.Count != 2 || g.Token != gw.Token {
		t.Fatalf("write re-entry: %+v, want count 2 and token %d", g, gw.Token)
	}
	le = mustRefuse(t, f.d, r1)
	if le.Token != gw.Token || le.RetryAfter < 9*time.Second {
		t.Fatalf("reader refused by the writer: %+v, want the writer's token %d and its PTTL", le, gw.Token)
	}
	mustRefuse(t, f.d, kreq(name, "w2", driver.Write))
	if _, err := f.d.Release(ctxT(t), klease(r1, gw)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release of the write grant by a reader's owner: %v, want ErrNotHeld", err)
	}
	if _, err := f.d.Release(ctxT(t), klease(kreq(name, "w", driver.Read), gw)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release of the writer's grant as a read: %v, want ErrNotHeld", err)
	}
	mustRelease(t, f.d, klease(w, gw), 1)
	mustRelease(t, f.d, klease(w, gw), 0)
	g3 := mustGrant(t, f.d, r1)
	if g3.Token <= gw.Token {
		t.Fatalf("reader's token %d <= the earlier writer's %d", g3.Token, gw.Token)
	}
	mustRelease(t, f.d, klease(r1, g3), 0)
	mustRelease(t, f.d, klease(kreq(name, "m", driver.Exclusive), gm), 0)
	mustRelease(t, f.d, klease(kreq(name, "p", driver.Permit), gp), 0)
	// Nothing is left but the counters.
	ctx := ctxT(t)
	kk := redisscript.KindKeysFor(DefaultKeyPrefix, name, driver.Read)
	if n := f.admin.Exists(ctx, kk.Writer, kk.Holders, kk.Values).Val(); n != 0 {
		t.Fatalf("%d read/write keys left after every release", n)
	}
}

// TestWriterPreference: a refused waiting writer's mark refuses new readers
// of other owners (not readers re-entering, nor a one-shot writer's
// refusal), until the writer is granted, withdraws, or its mark expires a
// TTL after its last refused attempt.
func TestWriterPreference(t *testing.T) {
	f := newFixture(t)
	const name = "pref"
	r1 := kreq(name, "r1", driver.Read)
	g1 := mustGrant(t, f.d, r1)
	// A TryLock (not waiting) leaves no mark.
	mustRefuse(t, f.d, kreq(name, "w", driver.Write))
	g2 := mustGrant(t, f.d, kreq(name, "r2", driver.Read))
	mustRelease(t, f.d, klease(kreq(name, "r2", driver.Read), g2), 0)

	w := kreq(name, "w", driver.Write)
	w.Waiting, w.TTL = true, 2*time.Second
	mustRefuse(t, f.d, w)
	le := mustRefuse(t, f.d, kreq(name, "r2", driver.Read))
	if le.RetryAfter <= 0 || le.RetryAfter > 2*time.Second {
		t.Fatalf("reader refused by the mark: %+v, want RetryAfter within the mark's 2s", le)
	}
	if g := mustGrant(t, f.d, r1); g.Count != 2 {
		t.Fatalf("a reader re-enters past the mark: %+v", g)
	}
	// Withdraw lets readers in at once.
	if err := f.d.Withdraw(ctxT(t), w); err != nil {
		t.Fatal(err)
	}
	g2 = mustGrant(t, f.d, kreq(name, "r2", driver.Read))
	mustRelease(t, f.d, klease(kreq(name, "r2", driver.Read), g2), 0)

	// The mark expires a TTL after the last refused attempt.
	mustRefuse(t, f.d, w)
	start := time.Now()
	mustRefuse(t, f.d, kreq(name, "r3", driver.Read))
	testwait.Until(t, 10*time.Second, "the mark to expire", func() bool {
		_, err := f.d.TryAcquire(ctxT(t), kreq(name, "r3", driver.Read))
		return err == nil
	})
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("readers admitted %v after the writer's refusal; its mark lasts its 2s TTL", took)
	}
	// Once the readers leave, the waiting writer gets in and its mark goes.
	mustRefuse(t, f.d, w)
	for _, o := range []string{"r1", "r1", "r3"} {
		_, _ = f.d.Release(ctxT(t), klease(kreq(name, o, driver.Read), driver.Grant{}))
	}
	gw := mustGrant(t, f.d, w)
	mustRelease(t, f.d, klease(w, gw), 0)
	mustGrant(t, f.d, kreq(name, "r4", driver.Read))
	_ = g1
}

// TestSemaphoreRules: at most Permits holders; re-entry keeps the token;
// tokens strictly increase; a different count is refused wrapping
// ErrInvalid while a permit is taken, and changes nothing; an idle
// semaphore takes a new count.
func TestSemaphoreRules(t *testing.T) {
	f := newFixture(t)
	const name = "sem"
	a, b, c := kreq(name, "a", driver.Permit), kreq(name, "b", driver.Permit), kreq(name, "c", driver.Permit)
	ga := mustGrant(t, f.d, a)
	gb := mustGrant(t, f.d, b)
	if gb.Token <= ga.Token {
		t.Fatalf("tokens %d then %d", ga.Token, gb.Token)
	}
	if g := mustGrant(t, f.d, a); g.Count != 2 || g.Token != ga.Token {
		t.Fatalf("permit re-entry: %+v, want count 2, token %d", g, ga.Token)
	}
	le := mustRefuse(t, f.d, c)
	if le.RetryAfter < 9*time.Second || le.Token != gb.Token {
		t.Fatalf("full semaphore's refusal: %+v", le)
	}
	c3 := c
	c3.Permits = 3
	if _, err := f.d.TryAcquire(ctxT(t), c3); !errors.Is(err, driver.ErrInvalid) || !containsAll(err.Error(), "2", "3") {
		t.Fatalf("another permit count while in use: %v, want ErrInvalid naming both counts", err)
	}
	mustRefuse(t, f.d, c) // still 2 permits
	mustRelease(t, f.d, klease(a, ga), 1)
	mustRelease(t, f.d, klease(a, ga), 0)
	gc := mustGrant(t, f.d, c)
	if gc.Token <= gb.Token {
		t.Fatalf("token %d after %d", gc.Token, gb.Token)
	}
	mustRelease(t, f.d, klease(b, gb), 0)
	mustRelease(t, f.d, klease(c, gc), 0)
	// Idle: a new count is taken.
	g := mustGrant(t, f.d, c3)
	mustGrant(t, f.d, func() driver.AcquireRequest { r := kreq(name, "d", driver.Permit); r.Permits = 3; return r }())
	mustGrant(t, f.d, func() driver.AcquireRequest { r := kreq(name, "e", driver.Permit); r.Permits = 3; return r }())
	if _, err := f.d.TryAcquire(ctxT(t), kreq(name, "f", driver.Permit)); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("count 2 while 3 is stored: %v", err)
	}
	_ = g
	if _, err := f.d.TryAcquire(ctxT(t), driver.AcquireRequest{Name: name, Owner: "z", TTL: time.Second, Kind: driver.Permit}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("0 permits: %v, want ErrInvalid", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		found := false
		for i := 0; i+len(x) <= len(s); i++ {
			if s[i:i+len(x)] == x {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// TestKindExpiryAndLockDelay: each reader and permit holder expires on its
// own; one that expired without a release keeps its place (blocks writers,
// stays counted) for its lock-delay and can no longer renew or release it.
func TestKindExpiryAndLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	const name = "delay"
	short := kreq(name, "short", driver.Read)
	short.TTL, short.LockDelay = time.Second, 2*time.Second
	long := kreq(name, "long", driver.Read)
	gs := mustGrant(t, f.d, short)
	gl := mustGrant(t, f.d, long)
	mustRelease(t, f.d, klease(long, gl), 0)
	w := kreq(name, "w", driver.Write)
	// short expires after 1s but blocks the writer for 2s more.
	testwait.Until(t, 10*time.Second, "the short reader's lease to expire", func() bool {
		infos, err := f.d.Inspect(ctx, name)
		return err == nil && len(infos) == 1 && infos[0].Readers == 0
	})
	if errs, err := f.d.Renew(ctx, []driver.Lease{klease(short, gs)}); err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("renew after expiry: %v %v, want ErrNotHeld", errs, err)
	}
	le := mustRefuse(t, f.d, w)
	if le.RetryAfter <= 0 || le.RetryAfter > 2*time.Second {
		t.Fatalf("writer refused in the reader's lock-delay: %+v, want RetryAfter ≤ 2s", le)
	}
	if _, err := f.d.Release(ctx, klease(short, gs)); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release after expiry: %v, want ErrNotHeld", err)
	}
	mustGrant(t, f.d, kreq(name, "r2", driver.Read)) // readers are not held back by it
	_, _ = f.d.Release(ctx, klease(kreq(name, "r2", driver.Read), driver.Grant{}))
	testwait.Until(t, 10*time.Second, "the lock-delay to end", func() bool {
		_, err := f.d.TryAcquire(ctx, w)
		return err == nil
	})

	// A permit that expired stays counted for its lock-delay.
	p1 := kreq("delay-sem", "p1", driver.Permit)
	p1.Permits, p1.TTL, p1.LockDelay = 1, time.Second, 2*time.Second
	g := mustGrant(t, f.d, p1)
	start := time.Now()
	p2 := p1
	p2.Owner, p2.LockDelay = "p2", 0
	testwait.Until(t, 15*time.Second, "the permit to come back", func() bool {
		_, err := f.d.TryAcquire(ctx, p2)
		return err == nil
	})
	if took := time.Since(start); took < 2500*time.Millisecond {
		t.Fatalf("permit back after %v; want its 1s TTL plus 2s lock-delay", took)
	}
	if errs, err := f.d.Renew(ctx, []driver.Lease{klease(p1, g)}); err != nil || !errors.Is(errs[0], driver.ErrNotHeld) {
		t.Fatalf("renew of the expired permit: %v %v", errs, err)
	}
}

// TestRenewMixedKinds: one Renew call with leases of every kind takes one
// round trip, extends each, and reports a lost one alone.
func TestRenewMixedKinds(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	var ls []driver.Lease
	for i, k := range []driver.Kind{driver.Exclusive, driver.Read, driver.Write, driver.Permit, driver.Read, driver.Permit} {
		req := kreq(fmt.Sprintf("mixed-%d", i), "o", k)
		req.TTL = 2 * time.Second
		g := mustGrant(t, f.d, req)
		l := klease(req, g)
		l.TTL = 30 * time.Second
		ls = append(ls, l)
	}
	lost := kreq("mixed-4", "o", driver.Read)
	if _, err := redisscript.DropKind(ctx, f.admin, redisscript.KindKeysFor(DefaultKeyPrefix, lost.Name, driver.Read)); err != nil {
		t.Fatal(err)
	}
	// Warm the script cache: a flushed cache costs a load per script.
	if _, err := f.d.Renew(ctx, ls); err != nil {
		t.Fatal(err)
	}
	hook := &countHook{}
	f.admin.AddHook(hook)
	for round := 0; round < 2; round++ {
		before := hook.n.Load()
		errs, err := f.d.Renew(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		if trips := hook.n.Load() - before; trips != 1 {
			t.Errorf("round %d: renewing %d leases of every kind took %d round trips, want 1", round, len(ls), trips)
		}
		for i, e := range errs {
			if (i == 4) != errors.Is(e, driver.ErrNotHeld) || (i != 4 && e != nil) {
				t.Fatalf("lease %d (%s): %v", i, ls[i].Kind, e)
			}
		}
	}
	infos, err := f.d.Inspect(ctx, "mixed-")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range infos {
		if in.Name == "mixed-4" {
			continue
		}
		if in.ExpiresIn < 20*time.Second {
			t.Errorf("%s (%s): expires in %v after a renewal to 30s", in.Name, in.Kind, in.ExpiresIn)
		}
	}
}

// TestKindReleasesWakeSubscribers: Subscribe(name) is woken by the releases
// of every kind of the name (a writer's, the last reader's, a permit's) and
// by a withdrawn writer mark, and every waiter of the driver is woken by
// such a release, not only the oldest.
func TestKindReleasesWakeSubscribers(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	const name = "wakekinds"
	var subs []driver.Subscription
	for i := 0; i < 2; i++ {
		s, err := f.d.Subscribe(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs = append(subs, s)
	}
	drain := func() {
		// The subscription's confirmation wakes its waiters once.
		for _, s := range subs {
			select {
			case <-s.C():
			case <-time.After(5 * time.Second):
			}
		}
	}
	drain()
	woken := func(what string) {
		t.Helper()
		for i, s := range subs {
			select {
			case <-s.C():
			case <-time.After(5 * time.Second):
				t.Fatalf("waiter %d not woken by %s", i, what)
			}
		}
	}
	quiet := func(what string) {
		t.Helper()
		for i, s := range subs {
			select {
			case <-s.C():
				t.Fatalf("waiter %d woken by %s", i, what)
			default:
			}
		}
	}
	r1, r2 := kreq(name, "r1", driver.Read), kreq(name, "r2", driver.Read)
	g1, g2 := mustGrant(t, f.d, r1), mustGrant(t, f.d, r2)
	mustRelease(t, f.d, klease(r1, g1), 0)
	// A reader release that leaves readers behind frees nothing.
	if err := f.admin.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	quiet("a release that leaves a reader")
	mustRelease(t, f.d, klease(r2, g2), 0)
	woken("the last reader's release")
	w := kreq(name, "w", driver.Write)
	gw := mustGrant(t, f.d, w)
	mustRelease(t, f.d, klease(w, gw), 0)
	woken("the writer's release")
	p := kreq(name, "p", driver.Permit)
	gp := mustGrant(t, f.d, p)
	mustRelease(t, f.d, klease(p, gp), 0)
	woken("a permit's release")
	gr := mustGrant(t, f.d, r1)
	w.Waiting = true
	mustRefuse(t, f.d, w)
	if err := f.d.Withdraw(ctx, w); err != nil {
		t.Fatal(err)
	}
	woken("the last waiting writer's withdrawal")
	mustRelease(t, f.d, klease(r1, gr), 0)
	woken("the reader's release")
}

// TestAcquireKinds: Acquire (the waiting path) of each kind waits for the
// release that frees it; a waiting writer holds back readers meanwhile, and
// one that gives up withdraws its mark.
func TestAcquireKinds(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	const name = "acq"
	r1 := kreq(name, "r1", driver.Read)
	g1 := mustGrant(t, f.d, r1)
	type res struct {
		g   driver.Grant
		err error
	}
	w := kreq(name, "w", driver.Write)
	done := make(chan res, 1)
	go func() {
		g, err := f.d.Acquire(ctx, w)
		done <- res{g, err}
	}()
	marked := func() bool {
		infos, err := f.d.Inspect(ctx, name)
		return err == nil && len(infos) == 1 && infos[0].Waiters == 1
	}
	testwait.Until(t, 10*time.Second, "the waiting writer's mark", marked)
	mustRefuse(t, f.d, kreq(name, "r2", driver.Read))
	mustRelease(t, f.d, klease(r1, g1), 0)
	var r res
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting writer was not granted after the last reader left")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	// A reader waits for the writer's release.
	rd := make(chan res, 1)
	go func() {
		g, err := f.d.Acquire(ctx, kreq(name, "r2", driver.Read))
		rd <- res{g, err}
	}()
	select {
	case r := <-rd:
		t.Fatalf("reader granted while the writer holds: %+v, %v", r.g, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	mustRelease(t, f.d, klease(w, r.g), 0)
	select {
	case r := <-rd:
		if r.err != nil {
			t.Fatal(r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting reader was not granted after the writer's release")
	}
	// A writer that gives up withdraws its mark at once.
	wctx, cancel := context.WithCancel(ctx)
	wd := make(chan error, 1)
	go func() {
		_, err := f.d.Acquire(wctx, kreq(name, "w2", driver.Write))
		wd <- err
	}()
	testwait.Until(t, 10*time.Second, "the second writer's mark", marked)
	mustRefuse(t, f.d, kreq(name, "r3", driver.Read))
	cancel()
	if err := <-wd; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled writer: %v", err)
	}
	mustGrant(t, f.d, kreq(name, "r3", driver.Read))
}

// TestMultiAcquire: TryAcquireMulti takes every name's mutex (the keys
// NewMutex uses) or none: one busy name refuses all and takes nothing.
func TestMultiAcquire(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	names := []string{"ma", "mb", "m{c}"}
	reqs := make([]driver.AcquireRequest, len(names))
	for i, n := range names {
		reqs[i] = driver.AcquireRequest{Name: n, Owner: "multi", TTL: 10 * time.Second}
	}
	busy := driver.AcquireRequest{Name: "mb", Owner: "other", TTL: 10 * time.Second}
	gb := mustGrant(t, f.d, busy)
	_, err := f.d.TryAcquireMulti(ctx, reqs)
	var le *driver.LockedError
	if !errors.As(err, &le) || le.Token != gb.Token {
		t.Fatalf("multi-acquire with a busy name: %v, want a LockedError with the holder's token %d", err, gb.Token)
	}
	for _, n := range []string{"ma", "m{c}"} {
		if f.admin.Exists(ctx, redisscript.KeysFor(DefaultKeyPrefix, n).Lock).Val() != 0 {
			t.Fatalf("%q taken by a refused multi-acquire", n)
		}
	}
	mustRelease(t, f.d, lease(busy, gb), 0)
	gs, err := f.d.TryAcquireMulti(ctx, reqs)
	if err != nil || len(gs) != 3 {
		t.Fatalf("multi-acquire of free names: %v, %v", gs, err)
	}
	for i, g := range gs {
		if g.Token == 0 || g.Count != 1 {
			t.Fatalf("grant %d: %+v", i, g)
		}
		mustRefuse(t, f.d, driver.AcquireRequest{Name: names[i], Owner: "other", TTL: time.Second})
	}
	// Re-entry by the same owner counts up.
	gs2, err := f.d.TryAcquireMulti(ctx, reqs)
	if err != nil || gs2[0].Count != 2 || gs2[0].Token != gs[0].Token {
		t.Fatalf("multi re-entry: %+v, %v", gs2, err)
	}
	for i, g := range gs {
		mustRelease(t, f.d, lease(reqs[i], g), 1)
		mustRelease(t, f.d, lease(reqs[i], g), 0)
	}
	// A queued waiter first in a free name's queue refuses the set.
	if _, err := redisscript.AcquireQueued(ctx, f.admin, redisscript.KeysFor(DefaultKeyPrefix, "mb"), "holder", time.Second, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := redisscript.AcquireQueued(ctx, f.admin, redisscript.KeysFor(DefaultKeyPrefix, "mb"), "waiter", time.Second, 0, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, _, err := redisscript.Release(ctx, f.admin, redisscript.KeysFor(DefaultKeyPrefix, "mb"), "holder", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.TryAcquireMulti(ctx, reqs); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("multi-acquire past a queued waiter: %v, want ErrLocked", err)
	}
	if _, err := f.d.TryAcquireMulti(ctx, []driver.AcquireRequest{reqs[0], {Name: "x", Owner: "someone", TTL: time.Second}}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("mixed owners: %v, want ErrInvalid", err)
	}
}

// TestInspectKinds: Inspect lists a name's mutex, read/write lock and
// semaphore apart, with readers, waiting writers, permits and holders.
func TestInspectKinds(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	const name = "insp"
	mustGrant(t, f.d, kreq(name, "m", driver.Exclusive))
	mustGrant(t, f.d, kreq(name, "r1", driver.Read))
	mustGrant(t, f.d, kreq(name, "r1", driver.Read))
	mustGrant(t, f.d, kreq(name, "r2", driver.Read))
	w := kreq(name, "w", driver.Write)
	w.Waiting = true
	mustRefuse(t, f.d, w)
	mustGrant(t, f.d, kreq(name, "p", driver.Permit))
	infos, err := f.d.Inspect(ctx, "insp")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 3 {
		t.Fatalf("Inspect: %+v, want the mutex, the rw lock and the semaphore", infos)
	}
	m, rw, sem := infos[0], infos[1], infos[2]
	if m.Kind != driver.Exclusive || m.Owner != "m" {
		t.Errorf("mutex: %+v", m)
	}
	if rw.Kind != driver.Write || rw.Readers != 2 || rw.Count != 3 || rw.Waiters != 1 || rw.Owner != "" || rw.Token != 2 || rw.ExpiresIn < 9*time.Second {
		t.Errorf("rw lock: %+v, want 2 readers holding 3 times, 1 waiting writer, token 2", rw)
	}
	if sem.Kind != driver.Permit || sem.Permits != 2 || sem.Holders != 1 || sem.Count != 1 || sem.Token != 1 {
		t.Errorf("semaphore: %+v, want 1 of 2 permits taken", sem)
	}
}
