package redlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

// slowHook delays every command of a client by the duration it holds (none
// when zero): a slow network in front of a real server.
type slowHook struct{ delay *atomic.Int64 }

func (h slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if d := time.Duration(h.delay.Load()); d > 0 {
			time.Sleep(d) // the fault: a reply that takes this long
		}
		return next(ctx, cmd)
	}
}

func (h slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// slowDriver is a driver over srvs whose every command waits for delay.
func slowDriver(t *testing.T, srvs []*testserver.Server, delay *atomic.Int64) *Driver {
	t.Helper()
	var clients []redis.UniversalClient
	for _, s := range srvs {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		c.AddHook(slowHook{delay})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	// A node timeout far above the delay: every node answers, late.
	d, err := New(clients, &Options{NodeTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestSlowGrantValidityIsTheClients: the driver does not judge a grant's
// validity with a drift of its own. The dlock package measures validity
// from the send with the user's Options.Drift and releases a grant that
// arrives too late; a driver-side check with the default drift
// (TTL/100 + 2ms) disagreed with any other Options.Drift, refusing grants
// the client would have accepted.
func TestSlowGrantValidityIsTheClients(t *testing.T) {
	srvs := testserver.RedisN(t, 3, nil)
	var delay atomic.Int64
	d := slowDriver(t, srvs, &delay)
	ctx := ctxT(t, 20*time.Second)
	const ttl = 100 * time.Millisecond

	// Every node answers after the whole TTL: the driver returns the grant
	// it got from a quorum and leaves validity to its caller.
	delay.Store(int64(ttl))
	g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: "slow", Owner: "o1", TTL: ttl})
	delay.Store(0)
	if err != nil {
		t.Fatalf("slow acquire: got %v, want the grant (validity is the dlock package's to judge)", err)
	}
	if _, err := d.Release(ctx, driver.Lease{Name: "slow", Owner: "o1", Token: g.Token, Handle: g.Handle, TTL: ttl}); err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Fatal(err)
	}

	// Through the dlock package the same late grant is refused and
	// released: another client takes the lock at once afterwards.
	c := dlock.New(d, &dlock.Options{TTL: ttl, Drift: time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	other := newClient(t, srvs, time.Second)
	delay.Store(int64(ttl))
	l, err := c.NewMutex("late", nil).TryLock(ctx)
	delay.Store(0)
	if err == nil {
		_ = l.Unlock(ctx)
		t.Fatal("a grant that arrived after the TTL was returned as a lease")
	}
	if errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("late grant: got %v, want an error that is not ErrLocked", err)
	}
	lo, err := other.NewMutex("late", nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("after a late grant was refused, the lock is not free: %v", err)
	}
	_ = lo.Unlock(ctx)
}
