package sqltest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// The driver-level checks of lock kinds, multi-acquire and fence raising
// that sqlitelock, pglock and mysqllock (lease mode) share. Each opens its
// drivers with open, like separate processes, against a real database.

const kindTTL = 10 * time.Second

func kreq(name, owner string, k driver.Kind) driver.AcquireRequest {
	r := driver.AcquireRequest{Name: name, Owner: owner, TTL: kindTTL, Kind: k}
	if k == driver.Permit {
		r.Permits = 2
	}
	return r
}

func klease(r driver.AcquireRequest, g driver.Grant) driver.Lease {
	return driver.Lease{Name: r.Name, Owner: r.Owner, Token: g.Token, Handle: g.Handle, TTL: r.TTL, LockDelay: r.LockDelay, Kind: r.Kind, Permits: r.Permits}
}

func grant(t *testing.T, d driver.Driver, r driver.AcquireRequest) driver.Grant {
	t.Helper()
	g, err := d.TryAcquire(context.Background(), r)
	if err != nil {
		t.Fatalf("TryAcquire(%s %q by %q): %v", r.Kind, r.Name, r.Owner, err)
	}
	return g
}

func refused(t *testing.T, d driver.Driver, r driver.AcquireRequest) *driver.LockedError {
	t.Helper()
	_, err := d.TryAcquire(context.Background(), r)
	var le *driver.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("TryAcquire(%s %q by %q) = %v, want a *LockedError", r.Kind, r.Name, r.Owner, err)
	}
	return le
}

func release(t *testing.T, d driver.Driver, r driver.AcquireRequest, g driver.Grant, want int) {
	t.Helper()
	n, err := d.Release(context.Background(), klease(r, g))
	if err != nil || n != want {
		t.Fatalf("Release(%s %q by %q) = %d, %v; want %d, nil", r.Kind, r.Name, r.Owner, n, err, want)
	}
}

func increasing(t *testing.T, what string, toks ...uint64) {
	t.Helper()
	for i := 1; i < len(toks); i++ {
		if toks[i] <= toks[i-1] {
			t.Fatalf("%s: tokens %v are not strictly increasing", what, toks)
		}
	}
}

// Kinds runs the driver-level rules of read/write locks and semaphores.
func Kinds(t *testing.T, open Open) {
	d := mustOpen(t, open)
	d2 := mustOpen(t, open)
	t.Cleanup(func() { d.Close(); d2.Close() })
	ctx := context.Background()
	if k, ok := d.(driver.Kinder); !ok || !k.SupportsKind(driver.Read) || !k.SupportsKind(driver.Write) || !k.SupportsKind(driver.Permit) {
		t.Fatal("the driver does not support Read, Write and Permit")
	}

	t.Run("ReadersShareWriterExcludes", func(t *testing.T) {
		n := RandomName("rw")
		ra, rb, wc := kreq(n, "a", driver.Read), kreq(n, "b", driver.Read), kreq(n, "c", driver.Write)
		ga := grant(t, d, ra)
		gb := grant(t, d2, rb)
		refused(t, d, wc)
		release(t, d, ra, ga, 0)
		refused(t, d2, wc)
		release(t, d2, rb, gb, 0)
		gc := grant(t, d, wc) // a release frees its place at once
		refused(t, d2, ra)
		refused(t, d2, kreq(n, "d", driver.Write))
		release(t, d, wc, gc, 0)
		ga2 := grant(t, d2, ra)
		increasing(t, "read, read, write, read", ga.Token, gb.Token, gc.Token, ga2.Token)
		release(t, d2, ra, ga2, 0)
	})

	t.Run("Reentry", func(t *testing.T) {
		n := RandomName("reenter")
		for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
			r := kreq(n, "a", k)
			g1 := grant(t, d, r)
			g2 := grant(t, d2, r)
			if g2.Count != 2 || g2.Token != g1.Token {
				t.Fatalf("%s re-entry: count %d token %d, want 2 and %d", k, g2.Count, g2.Token, g1.Token)
			}
			release(t, d, r, g2, 1)
			release(t, d, r, g1, 0)
			if _, err := d.Release(ctx, klease(r, g1)); !errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("%s: a third release = %v, want ErrNotHeld", k, err)
			}
		}
	})

	t.Run("UpgradeRefused", func(t *testing.T) {
		n := RandomName("upgrade")
		ra := kreq(n, "a", driver.Read)
		g := grant(t, d, ra)
		refused(t, d, kreq(n, "a", driver.Write))
		release(t, d, ra, g, 0)
		wa := kreq(n, "a", driver.Write)
		gw := grant(t, d, wa)
		refused(t, d, ra) // a writer excludes its own owner's reads too
		release(t, d, wa, gw, 0)
	})

	t.Run("WriterPreference", func(t *testing.T) {
		n := RandomName("pref")
		ra, rb := kreq(n, "a", driver.Read), kreq(n, "b", driver.Read)
		wc := kreq(n, "c", driver.Write)
		ga := grant(t, d, ra)
		// A one-shot refusal leaves no mark.
		refused(t, d2, wc)
		gb := grant(t, d2, rb)
		release(t, d2, rb, gb, 0)
		// A waiting writer's refusal does.
		wc.Waiting = true
		refused(t, d2, wc)
		refused(t, d2, rb)
		ga2 := grant(t, d, ra) // readers already in re-enter
		release(t, d, ra, ga2, 1)
		// Withdraw deletes the mark.
		if err := d2.(driver.Withdrawer).Withdraw(ctx, wc); err != nil {
			t.Fatal(err)
		}
		gb = grant(t, d2, rb)
		release(t, d2, rb, gb, 0)
		// A write grant deletes its owner's mark.
		refused(t, d2, wc)
		refused(t, d2, rb)
		release(t, d, ra, ga, 0)
		gc := grant(t, d2, wc)
		release(t, d2, wc, gc, 0)
		gb = grant(t, d2, rb)
		release(t, d2, rb, gb, 0)
	})

	t.Run("MarkExpires", func(t *testing.T) {
		n := RandomName("markexp")
		ra, rb := kreq(n, "a", driver.Read), kreq(n, "b", driver.Read)
		wc := kreq(n, "c", driver.Write)
		wc.Waiting, wc.TTL = true, time.Second
		ga := grant(t, d, ra)
		refused(t, d2, wc)
		le := refused(t, d2, rb)
		if le.RetryAfter <= 0 || le.RetryAfter > 2*time.Second {
			t.Errorf("a reader held back by a mark: RetryAfter %v, want the mark's time left (at most its 1s)", le.RetryAfter)
		}
		var gb driver.Grant
		testwait.Until(t, 15*time.Second, "the waiting writer's mark to expire", func() bool {
			g, err := d2.TryAcquire(ctx, rb)
			gb = g
			return err == nil
		})
		release(t, d2, rb, gb, 0)
		release(t, d, ra, ga, 0)
	})

	t.Run("Semaphore", func(t *testing.T) {
		n := RandomName("sem")
		pa, pb, pc := kreq(n, "a", driver.Permit), kreq(n, "b", driver.Permit), kreq(n, "c", driver.Permit)
		ga := grant(t, d, pa)
		gb := grant(t, d2, pb)
		le := refused(t, d, pc)
		if le.RetryAfter <= 0 {
			t.Errorf("refused permit: RetryAfter %v, want the first holder's time left", le.RetryAfter)
		}
		bad := pc
		bad.Permits = 3
		_, err := d.TryAcquire(ctx, bad)
		if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "2") || !strings.Contains(err.Error(), "3") {
			t.Fatalf("a permit count of 3 on a semaphore of 2: %v, want ErrInvalid naming both counts", err)
		}
		release(t, d, pa, ga, 0)
		gc := grant(t, d, pc)
		release(t, d2, pb, gb, 0)
		release(t, d, pc, gc, 0)
		// Idle, it takes a new count.
		var held []driver.AcquireRequest
		var hg []driver.Grant
		for _, o := range []string{"a", "b", "c"} {
			r := kreq(n, o, driver.Permit)
			r.Permits = 3
			held, hg = append(held, r), append(hg, grant(t, d, r))
		}
		fourth := kreq(n, "d", driver.Permit)
		fourth.Permits = 3
		refused(t, d, fourth)
		for i := range held {
			release(t, d, held[i], hg[i], 0)
		}
		gb = grant(t, d2, pb)
		gc = grant(t, d, pc)
		increasing(t, "permits", ga.Token, gb.Token, gc.Token)
		// Kinds of one name are separate locks.
		gm := grant(t, d, kreq(n, "z", driver.Exclusive))
		gw := grant(t, d, kreq(n, "z", driver.Write))
		release(t, d, kreq(n, "z", driver.Write), gw, 0)
		release(t, d, kreq(n, "z", driver.Exclusive), gm, 0)
		release(t, d2, pb, gb, 0)
		release(t, d, pc, gc, 0)
	})

	t.Run("ExpiryAndLockDelay", func(t *testing.T) {
		for _, k := range []driver.Kind{driver.Read, driver.Permit} {
			t.Run(k.String(), func(t *testing.T) {
				t.Parallel()
				n := RandomName("delay")
				r := kreq(n, "a", k)
				r.TTL, r.LockDelay = time.Second, 3*time.Second
				if k == driver.Permit {
					r.Permits = 1
				}
				blocked := kreq(n, "b", driver.Write)
				if k == driver.Permit {
					blocked = kreq(n, "b", driver.Permit)
					blocked.Permits = 1
				}
				g := grant(t, d, r)
				// The lease has expired once Inspect's ExpiresIn (lease
				// plus lock-delay left) is down to the lock-delay; the
				// holder still counts while its lock-delay blocks others.
				testwait.Until(t, 15*time.Second, "the lease to expire", func() bool {
					infos, err := d.(driver.Inspector).Inspect(ctx, n)
					if err != nil {
						t.Fatal(err)
					}
					for _, li := range infos {
						if li.Kind == driver.Exclusive {
							continue
						}
						if li.Readers+li.Holders != 1 || li.ExpiresIn <= 0 {
							t.Fatalf("%s: holder gone from Inspect inside its lock-delay: %+v", k, li)
						}
						return li.ExpiresIn <= r.LockDelay
					}
					t.Fatalf("%s: Inspect(%q) = %+v: no entry", k, n, infos)
					return false
				})
				if _, err := d.Release(ctx, klease(r, g)); !errors.Is(err, driver.ErrNotHeld) {
					t.Fatalf("%s: release after expiry = %v, want ErrNotHeld", k, err)
				}
				le := refused(t, d2, blocked) // inside the lock-delay
				if le.RetryAfter <= 0 {
					t.Errorf("%s: a refusal inside the lock-delay has RetryAfter %v", k, le.RetryAfter)
				}
				var gb driver.Grant
				testwait.Until(t, 20*time.Second, "the lock-delay to end", func() bool {
					g, err := d2.TryAcquire(ctx, blocked)
					gb = g
					return err == nil
				})
				if gb.Token <= g.Token {
					t.Fatalf("%s: token %d after an expired holder's %d", k, gb.Token, g.Token)
				}
				release(t, d2, blocked, gb, 0)
			})
		}
	})

	t.Run("RenewMixed", func(t *testing.T) {
		n := RandomName("renew")
		rs := []driver.AcquireRequest{kreq(n, "a", driver.Exclusive), kreq(n, "a", driver.Read), kreq(n, "b", driver.Read), kreq(n, "a", driver.Permit)}
		var ls []driver.Lease
		for _, r := range rs {
			ls = append(ls, klease(r, grant(t, d, r)))
		}
		stale := ls[1]
		stale.Token += 1000
		ls = append(ls, stale)
		errs, err := d.Renew(ctx, ls)
		if err != nil {
			t.Fatal(err)
		}
		for i, e := range errs[:4] {
			if e != nil {
				t.Errorf("renew %s by %s: %v", ls[i].Kind, ls[i].Owner, e)
			}
		}
		if !errors.Is(errs[4], driver.ErrNotHeld) {
			t.Errorf("renew with a wrong token: %v, want ErrNotHeld", errs[4])
		}
		for _, l := range ls[:4] {
			if _, err := d.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("Inspect", func(t *testing.T) {
		in, ok := d.(driver.Inspector)
		if !ok {
			t.Fatal("the driver is not an Inspector")
		}
		n := RandomName("inspect")
		var ls []driver.Lease
		for _, r := range []driver.AcquireRequest{kreq(n, "a", driver.Read), kreq(n, "b", driver.Read), kreq(n, "a", driver.Permit), kreq(n, "m", driver.Exclusive)} {
			ls = append(ls, klease(r, grant(t, d, r)))
		}
		infos, err := in.Inspect(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 3 || infos[0].Kind != driver.Exclusive || infos[1].Kind != driver.Write || infos[2].Kind != driver.Permit {
			t.Fatalf("Inspect = %+v, want the mutex, the read/write lock and the semaphore", infos)
		}
		rw, sem := infos[1], infos[2]
		if rw.Readers != 2 || rw.Owner != "" || rw.ExpiresIn <= 0 || rw.Token == 0 {
			t.Errorf("read/write lock: %+v, want 2 readers, no writer", rw)
		}
		if sem.Permits != 2 || sem.Holders != 1 || sem.ExpiresIn <= 0 {
			t.Errorf("semaphore: %+v, want 1 of 2 permits taken", sem)
		}
		for _, l := range ls {
			if _, err := d.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		infos, err = in.Inspect(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 3 || infos[1].Readers != 0 || infos[2].Holders != 0 || infos[1].ExpiresIn != 0 {
			t.Errorf("after the releases: %+v", infos)
		}
	})
}

// KindWakes checks that the release of each kind (Write, Read and Permit
// unless kinds says which) wakes a subscriber waiting for it: while the
// holder holds, the subscription stays quiet for longer than any poll
// backoff (1s), so a wake-up after the release came from the release. The
// kinds run in parallel.
func KindWakes(t *testing.T, open Open, kinds ...driver.Kind) {
	d := mustOpen(t, open)
	d2 := mustOpen(t, open)
	t.Cleanup(func() { d.Close(); d2.Close() })
	ctx := context.Background()
	if len(kinds) == 0 {
		kinds = []driver.Kind{driver.Write, driver.Read, driver.Permit}
	}
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			n := RandomName("kwake")
			r := kreq(n, "a", k)
			if k == driver.Permit {
				r.Permits = 1
			}
			g := grant(t, d, r)
			sub, err := d2.(driver.Notifier).Subscribe(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			testwait.Until(t, 20*time.Second, "the subscription to stay quiet for 1.5s while the lock is held", func() bool {
				q := time.NewTimer(1500 * time.Millisecond)
				defer q.Stop()
				select {
				case <-sub.C():
					return false
				case <-q.C:
					return true
				}
			})
			release(t, d, r, g, 0)
			select {
			case <-sub.C():
			case <-time.After(10 * time.Second):
				t.Fatalf("no wake-up within 10s of the release of a %s hold", k)
			}
		})
	}
}

// ReadersWakeTogether: readers waiting in one driver for a writer's
// release are all woken, not only the longest waiter: the first one
// woken takes its read, and the others are woken to share it.
func ReadersWakeTogether(t *testing.T, open Open) {
	d := mustOpen(t, open)
	d2 := mustOpen(t, open)
	t.Cleanup(func() { d.Close(); d2.Close() })
	ctx := context.Background()
	n := RandomName("readers")
	w := kreq(n, "w", driver.Write)
	gw := grant(t, d, w)
	var subs []driver.Subscription
	for i := 0; i < 3; i++ {
		s, err := d2.(driver.Notifier).Subscribe(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		subs = append(subs, s)
	}
	release(t, d, w, gw, 0)
	for i, s := range subs {
		select {
		case <-s.C():
		case <-time.After(10 * time.Second):
			t.Fatalf("waiting reader %d of %d not woken within 10s of the writer's release", i+1, len(subs))
		}
		r := kreq(n, "r"+string(rune('0'+i)), driver.Read)
		g := grant(t, d2, r)
		defer release(t, d2, r, g, 0)
	}
}

// WithdrawWakes: a reader held back by a waiting writer's mark, waiting in
// the driver the writer withdraws through, is woken by the Withdraw.
func WithdrawWakes(t *testing.T, open Open) {
	d := mustOpen(t, open)
	d2 := mustOpen(t, open)
	t.Cleanup(func() { d.Close(); d2.Close() })
	ctx := context.Background()
	n := RandomName("withdraw")
	ra, rb := kreq(n, "a", driver.Read), kreq(n, "b", driver.Read)
	w := kreq(n, "w", driver.Write)
	w.Waiting = true
	ga := grant(t, d, ra)
	refused(t, d2, w)
	refused(t, d2, rb)
	sub, err := d2.(driver.Notifier).Subscribe(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	testwait.Until(t, 20*time.Second, "the subscription to stay quiet for 1.5s while the reader holds", func() bool {
		q := time.NewTimer(1500 * time.Millisecond)
		defer q.Stop()
		select {
		case <-sub.C():
			return false
		case <-q.C:
			return true
		}
	})
	if err := d2.(driver.Withdrawer).Withdraw(ctx, w); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.C():
	case <-time.After(10 * time.Second):
		t.Fatal("a reader held back by the mark was not woken within 10s of the Withdraw")
	}
	gb := grant(t, d2, rb)
	release(t, d2, rb, gb, 0)
	release(t, d, ra, ga, 0)
}

// Multi checks driver.MultiAcquirer: all names or none.
func Multi(t *testing.T, open Open) {
	d := mustOpen(t, open)
	d2 := mustOpen(t, open)
	t.Cleanup(func() { d.Close(); d2.Close() })
	ctx := context.Background()
	ma, ok := d.(driver.MultiAcquirer)
	if !ok {
		t.Fatal("the driver is not a MultiAcquirer")
	}
	p := RandomName("multi")
	names := []string{p + "-a", p + "-b", p + "-c"}
	reqs := make([]driver.AcquireRequest, len(names))
	for i, n := range names {
		reqs[i] = kreq(n, "m", driver.Exclusive)
	}
	other := kreq(names[1], "o", driver.Exclusive)
	go1 := grant(t, d2, other)
	if _, err := ma.TryAcquireMulti(ctx, reqs); !errors.Is(err, driver.ErrLocked) {
		t.Fatalf("TryAcquireMulti with %s held: %v, want ErrLocked", names[1], err)
	}
	// Nothing was left taken: a third owner gets the free names.
	for _, i := range []int{0, 2} {
		r := kreq(names[i], "x", driver.Exclusive)
		release(t, d2, r, grant(t, d2, r), 0)
	}
	release(t, d2, other, go1, 0)
	gs, err := ma.TryAcquireMulti(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != len(reqs) {
		t.Fatalf("%d grants for %d names", len(gs), len(reqs))
	}
	for i, g := range gs {
		if g.Token == 0 || g.Count != 1 {
			t.Fatalf("grant %d: %+v", i, g)
		}
		refused(t, d2, kreq(names[i], "o", driver.Exclusive))
	}
	if g := gs[1]; g.Token <= go1.Token {
		t.Fatalf("token %d after %d", g.Token, go1.Token)
	}
	// Re-entry through the multi path counts up, and plain releases undo it.
	gs2, err := ma.TryAcquireMulti(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if gs2[i].Count != 2 || gs2[i].Token != gs[i].Token {
			t.Fatalf("re-entry %d: %+v after %+v", i, gs2[i], gs[i])
		}
		release(t, d, reqs[i], gs[i], 1)
		release(t, d, reqs[i], gs[i], 0)
	}
}

// RaiseFence checks driver.FenceRaiser: the next grant of the kind is
// above the raised value, a lower raise changes nothing, and a raise never
// touches a current holder's grant.
func RaiseFence(t *testing.T, open Open) {
	d := mustOpen(t, open)
	t.Cleanup(func() { d.Close() })
	ctx := context.Background()
	fr, ok := d.(driver.FenceRaiser)
	if !ok {
		t.Fatal("the driver is not a FenceRaiser")
	}
	raise := func(n string, k driver.Kind, v uint64) {
		t.Helper()
		if err := fr.RaiseFence(ctx, n, k, v); err != nil {
			t.Fatalf("RaiseFence(%q, %s, %d): %v", n, k, v, err)
		}
	}
	kinds := []driver.Kind{driver.Exclusive, driver.Read, driver.Permit}
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			n := RandomName("raise")
			r := kreq(n, "a", k)
			raise(n, k, 41) // a name never used
			g := grant(t, d, r)
			if g.Token != 42 {
				t.Fatalf("token %d after a raise to 41, want 42", g.Token)
			}
			release(t, d, r, g, 0)
			raise(n, k, 10) // lower: no change
			g = grant(t, d, r)
			if g.Token != 43 {
				t.Fatalf("token %d after a lower raise, want 43", g.Token)
			}
			// Held: the holder keeps its token, renews and releases.
			raise(n, k, 100)
			errs, err := d.Renew(ctx, []driver.Lease{klease(r, g)})
			if err != nil || errs[0] != nil {
				t.Fatalf("renew after a raise: %v %v", err, errs)
			}
			g2 := grant(t, d, r)
			if g2.Token != g.Token || g2.Count != 2 {
				t.Fatalf("re-entry after a raise: %+v, want token %d count 2", g2, g.Token)
			}
			release(t, d, r, g2, 1)
			release(t, d, r, g, 0)
			g = grant(t, d, r)
			if g.Token != 101 {
				t.Fatalf("token %d after a raise to 100 while held, want 101", g.Token)
			}
			release(t, d, r, g, 0)
		})
	}
	t.Run("WriteSharesReadCounter", func(t *testing.T) {
		n := RandomName("raise")
		raise(n, driver.Write, 7)
		r := kreq(n, "a", driver.Read)
		g := grant(t, d, r)
		if g.Token != 8 {
			t.Fatalf("read token %d after a write raise to 7, want 8", g.Token)
		}
		release(t, d, r, g, 0)
		m := kreq(n, "a", driver.Exclusive)
		if g := grant(t, d, m); g.Token != 1 {
			t.Fatalf("mutex token %d: the read/write raise leaked into the mutex", g.Token)
		}
	})
}
