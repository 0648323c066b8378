package sqltest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testwait"
)

// GrantKeys checks driver.Grant.Key (sqlcommon.GrantKey): every grant, a
// re-entry and, when the driver is a MultiAcquirer that accepts it, each
// grant of a multi-acquire, carries "<table>/<name>" for a mutex and
// "<table>_holders/<name>/<kind>/<owner>" for the kinds the driver
// supports. table returns the driver's (unquoted) lock table name.
func GrantKeys(t *testing.T, open Open, table func(driver.Driver) string) {
	d := mustOpen(t, open)
	t.Cleanup(func() { d.Close() })
	tb := table(d)
	if tb == "" {
		t.Fatal("empty table name")
	}
	n := RandomName("key")
	check := func(r driver.AcquireRequest, g driver.Grant, want string) {
		t.Helper()
		if g.Key != want {
			t.Fatalf("%s %q by %q: Key %q, want %q", r.Kind, r.Name, r.Owner, g.Key, want)
		}
	}
	m := kreq(n, "a", driver.Exclusive)
	g := grant(t, d, m)
	check(m, g, tb+"/"+n)
	g2 := grant(t, d, m) // re-entry
	check(m, g2, tb+"/"+n)
	release(t, d, m, g, 1)
	release(t, d, m, g, 0)

	ks, _ := d.(driver.Kinder)
	for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
		if ks == nil || !ks.SupportsKind(k) {
			continue
		}
		r := kreq(n, "o-"+k.String(), k)
		g := grant(t, d, r)
		check(r, g, tb+"_holders/"+n+"/"+k.String()+"/o-"+k.String())
		release(t, d, r, g, 0)
	}

	ma, ok := d.(driver.MultiAcquirer)
	if !ok {
		return
	}
	reqs := []driver.AcquireRequest{kreq(n+"-a", "m", driver.Exclusive), kreq(n+"-b", "m", driver.Exclusive)}
	gs, err := ma.TryAcquireMulti(context.Background(), reqs)
	if errors.Is(err, driver.ErrUnsupported) {
		return // a session mode
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		check(r, gs[i], tb+"/"+r.Name)
		release(t, d, r, gs[i], 0)
	}
}

// KindLockDelayInspect checks that Inspect's ExpiresIn of a read/write
// lock and a semaphore includes the lock-delay, as a mutex row's does: it
// is the time until the lock can be taken. A holder whose lease ran out
// unreleased still counts (Owner, Readers, Holders) until its lock-delay
// ends, since it still blocks others.
func KindLockDelayInspect(t *testing.T, open Open) {
	d := mustOpen(t, open)
	t.Cleanup(func() { d.Close() })
	in, ok := d.(driver.Inspector)
	if !ok {
		t.Fatal("the driver is not an Inspector")
	}
	const delay = time.Minute
	ctx := context.Background()
	for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
		t.Run(k.String(), func(t *testing.T) {
			n := RandomName("kdelay")
			r := kreq(n, "h", k)
			r.TTL, r.LockDelay = time.Second, delay
			t0 := time.Now()
			grant(t, d, r)
			info := func() driver.LockInfo {
				t.Helper()
				infos, err := in.Inspect(ctx, n)
				if err != nil {
					t.Fatal(err)
				}
				for _, li := range infos {
					if li.Name == n && li.Kind != driver.Exclusive {
						return li
					}
				}
				t.Fatalf("Inspect(%q) = %+v: no %s entry", n, infos, k)
				return driver.LockInfo{}
			}
			held := func(li driver.LockInfo) bool {
				switch k {
				case driver.Read:
					return li.Readers == 1
				case driver.Write:
					return li.Owner == "h" && li.Count >= 1
				}
				return li.Holders == 1
			}
			// Held: lease (1 s) plus lock-delay (1 min) from now.
			if li := info(); !held(li) || li.ExpiresIn < delay/2 || li.ExpiresIn > delay+10*time.Second {
				t.Fatalf("held with a %v lock-delay: %+v, want the holder and ExpiresIn about %v", delay, li, delay+time.Second)
			}
			// Lost: once the lease ran out, the owner itself is refused
			// (its grant is inside its lock-delay). It is asked only
			// once the lease should be over by this clock, since a
			// re-entry while the lease lasts would renew it.
			testwait.Until(t, 20*time.Second, "the lease to run out", func() bool {
				if time.Since(t0) < r.TTL+300*time.Millisecond {
					return false
				}
				_, err := d.TryAcquire(ctx, r)
				return errors.Is(err, driver.ErrLocked)
			})
			// ...and Inspect still shows it blocking for the lock-delay.
			if li := info(); !held(li) || li.ExpiresIn < delay/2 {
				t.Fatalf("lost inside its lock-delay: %+v, want the holder and ExpiresIn about %v", li, delay)
			}
		})
	}
}
