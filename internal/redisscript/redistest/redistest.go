// Package redistest holds driver tests shared by redislock and redlock:
// keys that dlock did not write (another client's lock, a Redisson hash, a
// stray list) at the keys of a lock's name, and Close racing Lock. They run
// through the dlock API against real redis-servers; admins are plain clients
// to the same servers (one per node) that the tests use to plant and check
// keys.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// NewDriver opens a fresh driver for a test (the test closes it).
type NewDriver func(ctx context.Context) (driver.Driver, error)

// ForeignKeys runs the foreign-key tests: a key dlock did not write, at the
// lock key or at the fencing counter of a name, on every node, is a lock
// held by an unknown owner. It is never overwritten, a waiting Lock waits
// for it to expire or be deleted, Release and Renew of a dlock owner report
// ErrNotHeld, and Inspect shows it with Owner "?", Token 0 and ExpiresIn its
// PTTL (negative without one).
func ForeignKeys(t *testing.T, admins []*redis.Client, open NewDriver) {
	newClient := func(t *testing.T) (*dlock.Client, driver.Driver) {
		t.Helper()
		d, err := open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: 5 * time.Second, WaitMax: 50 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		return c, d
	}
	each := func(t *testing.T, fn func(a *redis.Client) error) {
		t.Helper()
		for i, a := range admins {
			if err := fn(a); err != nil {
				t.Fatalf("node %d: %v", i, err)
			}
		}
	}
	ctxT := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	// refused checks that TryLock is refused with ErrLocked, not an
	// OpError.
	refused := func(t *testing.T, ctx context.Context, c *dlock.Client, name string) {
		t.Helper()
		l, err := c.NewMutex(name, nil).TryLock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
			t.Fatalf("TryLock over a foreign key: granted token %d", l.Token())
		}
		var oe *dlock.OpError
		if !errors.Is(err, dlock.ErrLocked) || errors.As(err, &oe) {
			t.Fatalf("TryLock over a foreign key: %v; want ErrLocked, not an OpError", err)
		}
	}
	// notHeld checks that a dlock owner's Release and Renew against the
	// foreign key report ErrNotHeld.
	notHeld := func(t *testing.T, ctx context.Context, d driver.Driver, name string) {
		t.Helper()
		l := driver.Lease{Name: name, Owner: "dlock-owner", TTL: 5 * time.Second}
		if n, err := d.Release(ctx, l); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("Release over a foreign key: %d, %v; want ErrNotHeld", n, err)
		}
		l.Token = 7
		errs, err := d.Renew(ctx, []driver.Lease{l})
		if err != nil || len(errs) != 1 || !errors.Is(errs[0], driver.ErrNotHeld) {
			t.Fatalf("Renew over a foreign key: %v, %v; want [ErrNotHeld]", errs, err)
		}
	}
	// shown checks Inspect's row for name: held by "?", token 0, and an
	// ExpiresIn in (0, max] (max > 0) or negative (max < 0).
	shown := func(t *testing.T, ctx context.Context, c *dlock.Client, name string, max time.Duration) {
		t.Helper()
		infos, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatalf("Inspect with a foreign key: %v", err)
		}
		var li *dlock.LockInfo
		for i := range infos {
			if infos[i].Name == name {
				li = &infos[i]
			}
		}
		if li == nil {
			t.Fatalf("Inspect = %+v; no row for %q", infos, name)
		}
		ok := li.Owner == "?" && li.Token == 0 && li.Count == 1
		if max > 0 {
			ok = ok && li.ExpiresIn > 0 && li.ExpiresIn <= max
		} else {
			ok = ok && li.ExpiresIn < 0
		}
		if !ok {
			t.Fatalf("Inspect row %+v; want Owner \"?\", Token 0, Count 1, ExpiresIn %s", *li, map[bool]string{true: fmt.Sprintf("in (0, %v]", max), false: "negative (no TTL)"}[max > 0])
		}
	}
	// grantedAfter checks that a Lock started before the foreign key went
	// away is granted, and only after it went away.
	lockAfter := func(t *testing.T, ctx context.Context, c *dlock.Client, name string) (<-chan *dlock.Lease, <-chan error) {
		ch := make(chan *dlock.Lease, 1)
		errc := make(chan error, 1)
		go func() {
			l, err := c.NewMutex(name, nil).Lock(ctx)
			if err != nil {
				errc <- err
				return
			}
			ch <- l
		}()
		return ch, errc
	}

	t.Run("StringWithTTL", func(t *testing.T) {
		c, d := newClient(t)
		ctx := ctxT(t)
		const name = "foreign-px"
		k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
		start := time.Now()
		each(t, func(a *redis.Client) error {
			return a.SetArgs(ctx, k.Lock, "v", redis.SetArgs{Mode: "NX", TTL: 300 * time.Millisecond}).Err()
		})
		refused(t, ctx, c, name)
		_, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Second})
		var le *driver.LockedError
		if !errors.As(err, &le) || le.RetryAfter <= 0 || le.RetryAfter > 300*time.Millisecond || le.Token != 0 {
			t.Fatalf("TryAcquire over a foreign key with PX 300: %v (%+v); want a LockedError with RetryAfter in (0, 300ms], token 0", err, le)
		}
		shown(t, ctx, c, name, 300*time.Millisecond)
		l, err := c.NewMutex(name, nil).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock waiting for a foreign key to expire: %v", err)
		}
		if el := time.Since(start); el < 300*time.Millisecond {
			t.Fatalf("granted %v after a foreign SET PX 300", el)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("StringWithoutTTL", func(t *testing.T) {
		c, d := newClient(t)
		ctx := ctxT(t)
		const name = "foreign-forever"
		k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
		each(t, func(a *redis.Client) error { return a.Set(ctx, k.Lock, "someone else", 0).Err() })
		refused(t, ctx, c, name)
		_, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "o", TTL: time.Second, LockDelay: time.Second})
		var le *driver.LockedError
		if !errors.As(err, &le) || le.RetryAfter != 0 {
			t.Fatalf("TryAcquire over a foreign key without TTL: %v (%+v); want a LockedError with RetryAfter 0 (unknown)", err, le)
		}
		notHeld(t, ctx, d, name)
		shown(t, ctx, c, name, -1)
		got, errc := lockAfter(t, ctx, c, name)
		time.Sleep(300 * time.Millisecond) // the foreign holder holds it this long
		select {
		case l := <-got:
			t.Fatalf("Lock granted (token %d) over a foreign key without TTL", l.Token())
		case err := <-errc:
			t.Fatalf("Lock over a foreign key without TTL: %v; want it to wait", err)
		default:
		}
		each(t, func(a *redis.Client) error {
			if v, err := a.Get(ctx, k.Lock).Result(); err != nil || v != "someone else" {
				return fmt.Errorf("foreign key is now %q, %v; want it untouched", v, err)
			}
			return a.Del(ctx, k.Lock).Err()
		})
		select {
		case l := <-got:
			_ = l.Unlock(ctx)
		case err := <-errc:
			t.Fatalf("Lock after the foreign key was deleted: %v", err)
		}
	})

	t.Run("Hash", func(t *testing.T) {
		c, d := newClient(t)
		ctx := ctxT(t)
		const name = "foreign-hash"
		k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
		start := time.Now()
		each(t, func(a *redis.Client) error {
			if err := a.HSet(ctx, k.Lock, "8a7c:1", 1).Err(); err != nil {
				return err
			}
			return a.PExpire(ctx, k.Lock, 400*time.Millisecond).Err()
		})
		refused(t, ctx, c, name)
		notHeld(t, ctx, d, name)
		shown(t, ctx, c, name, 400*time.Millisecond)
		each(t, func(a *redis.Client) error {
			if v, err := a.HGet(ctx, k.Lock, "8a7c:1").Result(); err != nil || v != "1" {
				return fmt.Errorf("foreign hash field is %q, %v; want it untouched", v, err)
			}
			return nil
		})
		l, err := c.NewMutex(name, nil).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock waiting for a foreign hash to expire: %v", err)
		}
		if el := time.Since(start); el < 400*time.Millisecond {
			t.Fatalf("granted %v after a foreign hash with PX 400", el)
		}
		_ = l.Unlock(ctx)
	})

	t.Run("ListWithoutTTL", func(t *testing.T) {
		c, d := newClient(t)
		ctx := ctxT(t)
		const name = "foreign-list"
		k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
		each(t, func(a *redis.Client) error { return a.RPush(ctx, k.Lock, "x").Err() })
		refused(t, ctx, c, name)
		notHeld(t, ctx, d, name)
		shown(t, ctx, c, name, -1)
		each(t, func(a *redis.Client) error {
			if v, err := a.LRange(ctx, k.Lock, 0, -1).Result(); err != nil || len(v) != 1 || v[0] != "x" {
				return fmt.Errorf("foreign list is %q, %v; want it untouched", v, err)
			}
			return a.Del(ctx, k.Lock).Err()
		})
		l, err := c.NewMutex(name, nil).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after the foreign list was deleted: %v", err)
		}
		_ = l.Unlock(ctx)
	})

	// A foreign fencing counter: dlock cannot draw a token from it, so the
	// name is held by an unknown owner until it is deleted.
	for _, tc := range []struct {
		kind  string
		plant func(ctx context.Context, a *redis.Client, key string) error
		check func(ctx context.Context, a *redis.Client, key string) error
	}{
		{"String", func(ctx context.Context, a *redis.Client, key string) error {
			return a.Set(ctx, key, "not a number", 0).Err()
		}, func(ctx context.Context, a *redis.Client, key string) error {
			if v, err := a.Get(ctx, key).Result(); err != nil || v != "not a number" {
				return fmt.Errorf("foreign fence key is %q, %v; want it untouched", v, err)
			}
			return nil
		}},
		{"Hash", func(ctx context.Context, a *redis.Client, key string) error {
			return a.HSet(ctx, key, "f", "v").Err()
		}, func(ctx context.Context, a *redis.Client, key string) error {
			if v, err := a.HGetAll(ctx, key).Result(); err != nil || len(v) != 1 || v["f"] != "v" {
				return fmt.Errorf("foreign fence hash is %v, %v; want it untouched", v, err)
			}
			return nil
		}},
		{"Set", func(ctx context.Context, a *redis.Client, key string) error {
			return a.SAdd(ctx, key, "m").Err()
		}, func(ctx context.Context, a *redis.Client, key string) error {
			if v, err := a.SMembers(ctx, key).Result(); err != nil || len(v) != 1 || v[0] != "m" {
				return fmt.Errorf("foreign fence set is %v, %v; want it untouched", v, err)
			}
			return nil
		}},
	} {
		t.Run("Fence"+tc.kind, func(t *testing.T) {
			c, d := newClient(t)
			ctx := ctxT(t)
			name := "foreign-fence-" + tc.kind
			k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
			each(t, func(a *redis.Client) error { return tc.plant(ctx, a, k.Fence) })
			refused(t, ctx, c, name)
			notHeld(t, ctx, d, name)
			shown(t, ctx, c, name, -1)
			got, errc := lockAfter(t, ctx, c, name)
			time.Sleep(200 * time.Millisecond) // the foreign key stays this long
			select {
			case l := <-got:
				t.Fatalf("Lock granted (token %d) over a foreign fence key", l.Token())
			case err := <-errc:
				t.Fatalf("Lock over a foreign fence key: %v; want it to wait", err)
			default:
			}
			each(t, func(a *redis.Client) error {
				if err := tc.check(ctx, a, k.Fence); err != nil {
					return err
				}
				if n, err := a.Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
					return fmt.Errorf("lock key written (%d, %v) while the fence key is foreign", n, err)
				}
				return a.Del(ctx, k.Fence).Err()
			})
			select {
			case l := <-got:
				if l.Token() == 0 {
					t.Fatal("token 0")
				}
				_ = l.Unlock(ctx)
			case err := <-errc:
				t.Fatalf("Lock after the foreign fence key was deleted: %v", err)
			}
		})
	}
}

// CloseRacingLock starts many Locks on distinct names with a 30s TTL and
// closes the client as soon as the first is granted, while the others are
// in flight; then every node must be free of those names' lock keys well
// within the TTL (expiry cannot hide a lock left behind). It repeats this a
// few times.
func CloseRacingLock(t *testing.T, admins []*redis.Client, open NewDriver) {
	const (
		rounds = 4
		locks  = 24
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r := 0; r < rounds; r++ {
		d, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
		names := make([]string, locks)
		first := make(chan struct{})
		var once sync.Once
		var wg sync.WaitGroup
		granted := 0
		var mu sync.Mutex
		for i := range names {
			names[i] = fmt.Sprintf("close-race-%d-%d", r, i)
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
				defer lcancel()
				if _, err := c.NewMutex(name, nil).Lock(lctx); err == nil {
					mu.Lock()
					granted++
					mu.Unlock()
					once.Do(func() { close(first) })
				}
			}(names[i])
		}
		select {
		case <-first:
		case <-ctx.Done():
			t.Fatal("no Lock granted")
		}
		if err := c.Close(); err != nil {
			t.Errorf("round %d: Close: %v", r, err)
		}
		wg.Wait()
		// Every lock the client or driver granted must be gone from every
		// node long before its 30s TTL.
		deadline := time.Now().Add(5 * time.Second)
		for i, a := range admins {
			for _, name := range names {
				k := redisscript.KeysFor(redisscript.DefaultPrefix, name)
				for {
					n, err := a.Exists(ctx, k.Lock).Result()
					if err != nil {
						t.Fatal(err)
					}
					if n == 0 {
						break
					}
					if time.Now().After(deadline) {
						v, _ := a.Get(ctx, k.Lock).Result()
						pttl, _ := a.PTTL(ctx, k.Lock).Result()
						t.Fatalf("round %d (%d of %d granted before Close): node %d still has %s = %q (PTTL %v) after Close", r, granted, locks, i, k.Lock, v, pttl)
					}
					time.Sleep(10 * time.Millisecond) // polling for the key to go, with a deadline
				}
			}
		}
	}
}
