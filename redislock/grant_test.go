package redislock

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisinfo"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/testwait"
)

// openDriver opens a second driver (another process) on f's server.
func (f *fixture) openDriver(t *testing.T, query string) *Driver {
	t.Helper()
	u, err := url.Parse(f.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.RawQuery = query
	d, err := OpenURL(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.(*Driver)
}

// grantRun is a lock held by "holder" on f.d and a waiting Acquire of
// "waiter" on a second driver, w, that has asked for grants.
type grantRun struct {
	f     *fixture
	ctx   context.Context
	w     *Driver
	k     redisscript.Keys
	hreq  driver.AcquireRequest
	hg    driver.Grant
	wreq  driver.AcquireRequest
	done  chan grantResult // the waiter's Acquire
	close func()           // ends the waiter's Acquire if it still waits
}

type grantResult struct {
	g   driver.Grant
	err error
}

// newGrantRun sets up a grantRun on name whose waiter has TTL wttl, and
// waits for the waiter's grant request.
func newGrantRun(t *testing.T, name string, wttl time.Duration) *grantRun {
	t.Helper()
	f := newFixture(t)
	ctx := ctxT(t)
	r := &grantRun{f: f, ctx: ctx, w: f.openDriver(t, ""), k: redisscript.KeysFor(DefaultKeyPrefix, name),
		hreq: driver.AcquireRequest{Name: name, Owner: "holder", TTL: 10 * time.Second},
		wreq: driver.AcquireRequest{Name: name, Owner: "waiter", TTL: wttl},
		done: make(chan grantResult, 1)}
	var err error
	if r.hg, err = f.d.TryAcquire(ctx, r.hreq); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		g, err := r.w.Acquire(wctx, r.wreq)
		r.done <- grantResult{g, err}
	}()
	r.close = cancel
	t.Cleanup(cancel)
	testwait.Until(t, 5*time.Second, "the waiter's grant request", func() bool {
		v, err := f.admin.HGet(ctx, redisscript.GrantsKey(r.k), "waiter").Result()
		return err == nil && strings.Contains(v, "\n")
	})
	return r
}

// TestHandOffByGrant: the release that frees a lock grants it to the
// queued waiter at once (the lock is the waiter's when the release
// returns, with the next token), and the waiter's Acquire returns that
// grant without another script call. Before grant-in-release the release
// deleted the lock and woke the waiter, which took it with an acquire of
// its own.
func TestHandOffByGrant(t *testing.T) {
	gr := newGrantRun(t, "handoff-grant", 10*time.Second)
	f, ctx, w, k, hreq, hg, wreq := gr.f, gr.ctx, gr.w, gr.k, gr.hreq, gr.hg, gr.wreq
	if _, err := f.d.Release(ctx, lease(hreq, hg)); err != nil {
		t.Fatal(err)
	}
	v, err := f.admin.Get(ctx, k.Lock).Result()
	if err != nil {
		t.Fatalf("the lock is free right after the release (%v): the release woke the waiter instead of granting it", err)
	}
	want := "1\n" + strconv.FormatUint(hg.Token+1, 10) + "\n\n\nwaiter"
	if v != want {
		t.Fatalf("right after the release the lock is %q, want the waiter's grant %q", v, want)
	}
	var r grantResult
	select {
	case r = <-gr.done:
	case <-ctx.Done():
		t.Fatal("the waiter's Acquire did not return after the grant")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.g.Token != hg.Token+1 || r.g.Count != 1 {
		t.Errorf("the waiter's grant: token %d count %d, want token %d count 1", r.g.Token, r.g.Count, hg.Token+1)
	}
	if n := w.grantsTaken.Load(); n != 1 {
		t.Errorf("grants taken from a message: %d, want 1 (the waiter tried again instead)", n)
	}
	if _, err := w.Release(ctx, lease(wreq, r.g)); err != nil {
		t.Fatalf("the waiter's release of its grant: %v", err)
	}
	if n, _ := f.admin.Exists(ctx, k.Lock, redisscript.GrantsKey(k), k.Queue).Result(); n != 0 {
		t.Errorf("%d of the lock, its grant records and its queue are left after the waiter's release", n)
	}
}

// TestGrantForNoWaiterReleased: a grant the server sends to a driver for
// an owner that has no waiting Acquire there (it gave up as the release
// granted it) is released by the driver, so the lock does not stay held
// by nobody until its TTL ends.
func TestGrantForNoWaiterReleased(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	w := f.openDriver(t, "")
	const name = "grant-gone"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	if !w.subscribeGrants(ctx) {
		t.Fatal("cannot subscribe the grant channel")
	}
	testwait.Until(t, 5*time.Second, "the grant channel subscribed", func() bool {
		m, err := f.admin.PubSubNumSub(ctx, w.grantCh).Result()
		return err == nil && m[w.grantCh] == 1
	})
	hreq := driver.AcquireRequest{Name: name, Owner: "holder", TTL: 10 * time.Second}
	hg, err := f.d.TryAcquire(ctx, hreq)
	if err != nil {
		t.Fatal(err)
	}
	// "ghost" asked for grants on w's channel and left w without a
	// waiting Acquire.
	if _, _, err := redisscript.AcquireWaiting(ctx, f.admin, k, "ghost", 30*time.Second, 0, queueWait, 0, w.grantCh); err != nil {
		t.Fatal(err)
	}
	if _, err := f.d.Release(ctx, lease(hreq, hg)); err != nil {
		t.Fatal(err)
	}
	if c, _ := f.admin.Get(ctx, k.Fence).Uint64(); c != hg.Token+1 {
		t.Fatalf("fencing counter %d after the release, want %d: the release made no grant", c, hg.Token+1)
	}
	testwait.Until(t, 5*time.Second, "the ghost's grant released by w", func() bool {
		n, err := f.admin.Exists(ctx, k.Lock).Result()
		return err == nil && n == 0
	})
}

// TestGrantWaiterCounts: a grant message counts only when its token is
// above the counter the waiter's latest refused attempt saw and every
// token an attempt of its own got since, and only after a refused
// attempt.
func TestGrantWaiterCounts(t *testing.T) {
	w := &grantWaiter{sig: make(chan struct{}, 1)}
	w.offer(9)
	if _, _, ok := w.counted(); ok {
		t.Error("a grant message counts before any refused attempt")
	}
	s := time.Now()
	w.refused(s, 9)
	if _, _, ok := w.counted(); ok {
		t.Error("a grant message with the counter's own token counts")
	}
	w.offer(10)
	if tok, sent, ok := w.counted(); !ok || tok != 10 || !sent.Equal(s) {
		t.Errorf("counted() = %d, %v, %v; want 10 from the refused attempt's send time", tok, sent, ok)
	}
	w.granted(11) // an attempt adopted the grant with token 11
	if _, _, ok := w.counted(); ok {
		t.Error("the message of a grant an attempt adopted still counts")
	}
}

// TestShortTTLWaiterRenewsForGrants: a waiter that asks for grants tries
// again (renewing its queue entry and its grant request) at least every
// TTL/4, so that a grant, whose lease counts from its last refused
// attempt, leaves it the two thirds of the TTL it needs to be taken from
// the message; with a 1.2s TTL the entry is renewed well within the
// 1s that plain waiters wait between attempts.
func TestShortTTLWaiterRenewsForGrants(t *testing.T) {
	gr := newGrantRun(t, "short-ttl-grant", 1200*time.Millisecond)
	f, ctx, k := gr.f, gr.ctx, gr.k
	first, err := f.admin.HGet(ctx, k.Waits, "waiter").Result()
	if err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 600*time.Millisecond, "the waiter's queue entry renewed (at least every TTL/4 = 300ms)", func() bool {
		v, err := f.admin.HGet(ctx, k.Waits, "waiter").Result()
		return err == nil && v != first
	})
	gr.close()
	<-gr.done
}

// TestHotLockHandOffCommands: a lock handed back and forth between two
// drivers' waiting Acquires costs the server two scripts per hand-off, the
// waiter's one attempt (queued, asking for a grant) and the holder's
// granting release, and no SUBSCRIBE or UNSUBSCRIBE: the release channel
// stays subscribed between the Acquires (listenLinger), so a waiting
// Acquire on it asks for a grant from its first attempt and needs no retry
// for a subscription's confirmation. Before, each waiting Acquire
// subscribed, tried again once subscribed, and unsubscribed as it returned.
func TestHotLockHandOffCommands(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	ds := []*Driver{f.d, f.openDriver(t, "")}
	const name = "hot-hand-off"
	k := redisscript.KeysFor(DefaultKeyPrefix, name)
	req := func(i int) driver.AcquireRequest {
		return driver.AcquireRequest{Name: name, Owner: "owner-" + strconv.Itoa(i), TTL: time.Minute}
	}
	type result struct {
		g   driver.Grant
		err error
	}
	g, err := ds[0].Acquire(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	// handOff has the other driver wait for the lock that holder holds with
	// grant g, then releases it, and returns the waiter's grant.
	handOff := func(holder int, g driver.Grant) driver.Grant {
		t.Helper()
		w := 1 - holder
		done := make(chan result, 1)
		go func() {
			g, err := ds[w].Acquire(ctx, req(w))
			done <- result{g, err}
		}()
		testwait.Until(t, 5*time.Second, "the waiter queued", func() bool {
			n, err := f.admin.ZCard(ctx, k.Queue).Result()
			return err == nil && n == 1
		})
		if _, err := ds[holder].Release(ctx, lease(req(holder), g)); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.g
	}
	// Two hand-offs subscribe each driver's release channel (and its
	// grant channel) and load the scripts.
	g = handOff(0, g)
	g = handOff(1, g)
	if err := f.admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const rounds = 10
	for i := range rounds {
		g = handOff(i%2, g)
	}
	s, err := f.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	st := redisinfo.Commands(s)
	if n := st["evalsha"].Calls; n != 2*rounds {
		t.Errorf("%d hand-offs ran %d scripts, want %d (one attempt and one release each)", rounds, n, 2*rounds)
	}
	if n := st["subscribe"].Calls + st["unsubscribe"].Calls; n != 0 {
		t.Errorf("%d hand-offs sent %d SUBSCRIBE and UNSUBSCRIBE, want none", rounds, n)
	}
	if n := st["publish"].Calls; n != rounds {
		t.Errorf("%d hand-offs published %d messages, want one grant each", rounds, n)
	}
	if _, err := ds[rounds%2].Release(ctx, lease(req(rounds%2), g)); err != nil {
		t.Fatal(err)
	}
}
