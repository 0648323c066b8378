package redislock

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/redisscript/redistest"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

func safetyEnv(t *testing.T) ([]*redis.Client, redistest.NewDriver) {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(opt)
	t.Cleanup(func() { _ = admin.Close() })
	return []*redis.Client{admin}, func(ctx context.Context) (driver.Driver, error) {
		u, err := url.Parse(srv.URL())
		if err != nil {
			return nil, err
		}
		return OpenURL(ctx, u)
	}
}

// TestForeignKeys: keys dlock did not write at a name's keys are locks held
// by an unknown owner (audit finding 7).
func TestForeignKeys(t *testing.T) {
	admins, open := safetyEnv(t)
	redistest.ForeignKeys(t, admins, open)
}

// TestCloseRacingLock: Close leaves no lock behind, in-flight grants
// included (audit finding 5, for a driver that owns its client).
func TestCloseRacingLock(t *testing.T) {
	admins, open := safetyEnv(t)
	redistest.CloseRacingLock(t, admins, open)
}

// TestCloseReleasesUnknownOutcome: an acquire whose reply was lost (the
// server paused past the request's deadline) may still be granted when the
// server resumes; nobody has a lease for it, so Close must release it.
func TestCloseReleasesUnknownOutcome(t *testing.T) {
	srv := testserver.Redis(t, nil)
	opt, err := redis.ParseURL(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(opt)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, _ := url.Parse(srv.URL())
	dd, err := OpenURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	d := dd.(*Driver)
	defer d.Close()
	// Load the script first, so the paused server gets one EVALSHA.
	if _, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "warm", Owner: "w", TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = d.TryAcquire(actx, driver.AcquireRequest{Name: "lost-reply", Owner: "o", TTL: 30 * time.Second})
	acancel()
	if rerr := srv.Resume(); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("TryAcquire on a paused server succeeded")
	}
	k := redisscript.KeysFor(DefaultKeyPrefix, "lost-reply")
	deadline := time.Now().Add(3 * time.Second)
	for {
		n, err := admin.Exists(ctx, k.Lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Skip("the server did not run the acquire whose reply was lost; nothing to release")
		}
		time.Sleep(10 * time.Millisecond) // polling for the server to run it, with a deadline
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n, err := admin.Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		pttl, _ := admin.PTTL(ctx, k.Lock).Result()
		t.Fatalf("after Close the acquire whose reply was lost still holds %s (PTTL %v): %d, %v", k.Lock, pttl, n, err)
	}
}

// TestWaiterSeesForeignDelete: a foreign lock's DEL publishes nothing, so a
// waiter behind a foreign key with a long TTL must poll at its wait ceiling
// rather than sleep out the key's whole PTTL.
func TestWaiterSeesForeignDelete(t *testing.T) {
	admins, open := safetyEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(d, &dlock.Options{WaitMax: 200 * time.Millisecond})
	defer c.Close()
	k := redisscript.KeysFor(redisscript.DefaultPrefix, "foreign-del")
	if err := admins[0].Set(ctx, k.Lock, "not-dlock", 60*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := c.NewMutex("foreign-del", nil).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	// The waiter has tried at least once when it has subscribed.
	testwait.Until(t, 10*time.Second, "the waiter to subscribe", func() bool {
		return admins[0].PubSubNumSub(ctx, k.Channel).Val()[k.Channel] > 0
	})
	deleted := time.Now()
	if err := admins[0].Del(ctx, k.Lock).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Lock after the foreign key was deleted: %v", err)
		}
		t.Logf("granted %v after the foreign DEL", time.Since(deleted).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not granted within 5s of the foreign key's DEL (it sleeps out the key's 60s PTTL)")
	}
}
