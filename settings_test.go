package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/memlock"
)

// minTTLDriver is a driver whose backend grants no TTL below an hour.
type minTTLDriver struct{ driver.Driver }

func (minTTLDriver) Limits() driver.Limits { return driver.Limits{MinTTL: time.Hour} }

// TestMutexSettings: Mutexes made without options share their Client's
// settings (one copy, not one per Mutex); one made with options has its
// own, and leaves the Client's alone; a lease is taken with its Mutex's
// settings; and a Client whose defaults its backend refuses reports that
// on every lock made without options.
func TestMutexSettings(t *testing.T) {
	ctx := context.Background()
	c := dlock.New(memlock.NewBackend().NewDriver(), &dlock.Options{TTL: 20 * time.Second})
	defer c.Close()
	m1, m2 := c.NewMutex("a", nil), c.NewMutex("b", nil)
	ttl1, owner1, at1 := dlock.MutexSettings(m1)
	_, _, at2 := dlock.MutexSettings(m2)
	if at1 != at2 || ttl1 != 20*time.Second || owner1 != "" {
		t.Errorf("two Mutexes without options: settings at %p and %p, TTL %v, owner %q; want one copy, 20s, none", at1, at2, ttl1, owner1)
	}
	m3 := c.NewMutex("c", &dlock.MutexOptions{TTL: time.Minute, Owner: "me"})
	ttl3, owner3, at3 := dlock.MutexSettings(m3)
	if ttl1, owner1, _ = dlock.MutexSettings(m1); at3 == at1 || ttl3 != time.Minute || owner3 != "me" || ttl1 != 20*time.Second || owner1 != "" {
		t.Errorf("a Mutex with options: TTL %v owner %q (the defaults' now %v, %q); want its own 1m, \"me\"", ttl3, owner3, ttl1, owner1)
	}
	for _, tc := range []struct {
		m     *dlock.Mutex
		ttl   time.Duration
		owner string
	}{{m1, 20 * time.Second, ""}, {m3, time.Minute, "me"}} {
		l, err := tc.m.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL() != tc.ttl || (tc.owner != "" && l.Owner() != tc.owner) {
			t.Errorf("%s: lease TTL %v owner %q, want %v %q", tc.m.Name(), l.TTL(), l.Owner(), tc.ttl, tc.owner)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}

	c2 := dlock.New(minTTLDriver{memlock.NewBackend().NewDriver()}, nil)
	defer c2.Close()
	for range 2 {
		if _, err := c2.NewMutex("a", nil).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("default TTL below the backend's minimum: %v, want ErrInvalid", err)
		}
	}
	l, err := c2.NewMutex("a", &dlock.MutexOptions{TTL: 2 * time.Hour}).TryLock(ctx)
	if err != nil {
		t.Fatalf("TTL 2h on a backend whose minimum is 1h: %v", err)
	}
	_ = l.Unlock(ctx)
}
