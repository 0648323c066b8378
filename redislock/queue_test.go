package redislock

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	dlock "github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
	"github.com/dlock/dlock/internal/redisscript/redistest"
	"github.com/dlock/dlock/internal/testwait"
)

// queueFixture is one redis-server with three dlock clients (processes)
// on it, an admin client, and the keys of one lock.
type queueFixture struct {
	admin *redis.Client
	cs    []*dlock.Client
	k     redisscript.Keys
	name  string
}

func newQueueFixture(t *testing.T) *queueFixture {
	t.Helper()
	f := newFixture(t)
	q := &queueFixture{admin: f.admin, name: "queued", k: redisscript.KeysFor(DefaultKeyPrefix, "queued")}
	u, err := url.Parse(f.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		d, err := OpenURL(context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		q.cs = append(q.cs, c)
	}
	return q
}

// waitQueued waits until n waiters are queued.
func (q *queueFixture) waitQueued(t *testing.T, ctx context.Context, n int64) {
	t.Helper()
	testwait.Until(t, 10*time.Second, "the waiters to be queued", func() bool {
		got, err := q.admin.ZCard(ctx, q.k.Queue).Result()
		return err == nil && got == n
	})
}

// lockAsync starts a Lock of the queue's lock on client i; the lease (or
// error) arrives on the returned channel.
func (q *queueFixture) lockAsync(ctx context.Context, i int) <-chan lockResult {
	ch := make(chan lockResult, 1)
	go func() {
		l, err := q.cs[i].NewMutex(q.name, nil).Lock(ctx)
		ch <- lockResult{i, l, err}
	}()
	return ch
}

type lockResult struct {
	who int
	l   *dlock.Lease
	err error
}

// TestQueueOrder: waiters in different processes are granted in the order
// they asked, and the holder asking again right after its Unlock goes
// behind them (before the queue, whoever's attempt reached the server first
// won, usually the releaser).
func TestQueueOrder(t *testing.T) {
	f := newFixture(t)
	u, err := url.Parse(f.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	redistest.QueueOrder(t, []*redis.Client{f.admin}, func(ctx context.Context) (driver.Driver, error) { return OpenURL(ctx, u) })
}

// TestTryLockBehindQueue: a free lock with a live waiter first in its queue
// is refused to TryLock (ErrLocked), and granted to the waiter.
func TestTryLockBehindQueue(t *testing.T) {
	q := newQueueFixture(t)
	ctx := ctxT(t)
	k := q.k
	// A waiter queued in a process that is not woken (it has not
	// subscribed): plant its entry as the script writes it.
	now, err := q.admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms := now.UnixMilli()
	q.admin.ZAdd(ctx, k.Queue, redis.Z{Score: float64(ms), Member: "parked"})
	q.admin.HSet(ctx, k.Waits, "parked", ms+queueWait.Milliseconds())
	if _, err := q.cs[0].NewMutex(q.name, nil).TryLock(ctx); !errors.Is(err, dlock.ErrLocked) {
		t.Fatalf("TryLock with a live waiter queued: %v, want ErrLocked", err)
	}
	l, err := q.cs[1].NewMutex(q.name, &dlock.MutexOptions{Owner: "parked"}).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock by the first waiter: %v", err)
	}
	if n, _ := q.admin.Exists(ctx, k.Queue, k.Waits).Result(); n != 0 {
		t.Fatalf("the granted waiter is still queued (%d queue keys)", n)
	}
	_ = l.Unlock(ctx)
}

// TestDeadWaiterExpires: a queued waiter that vanished (its entry is never
// renewed) holds the lock up only until its entry's deadline; then the
// next waiter gets it.
func TestDeadWaiterExpires(t *testing.T) {
	q := newQueueFixture(t)
	ctx := ctxT(t)
	now, err := q.admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms := now.UnixMilli()
	// Queued a millisecond before now: a Lock queued within the same
	// millisecond would tie with it, and ties go by owner (a random owner
	// may sort before "crashed"), letting the Lock be first at once.
	if err := q.admin.ZAdd(ctx, q.k.Queue, redis.Z{Score: float64(ms - 1), Member: "crashed"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := q.admin.HSet(ctx, q.k.Waits, "crashed", ms+500).Err(); err != nil {
		t.Fatal(err)
	}
	r := <-q.lockAsync(ctx, 0)
	if r.err != nil {
		t.Fatalf("Lock behind a dead waiter: %v", r.err)
	}
	if ok, _ := q.admin.HExists(ctx, q.k.Waits, "crashed").Result(); ok {
		t.Fatal("the dead waiter's entry is still there")
	}
	_ = r.l.Unlock(ctx)
}

// TestWaiterLeavesQueue: Inspect counts a queued waiter; a Lock whose
// context ends leaves the queue, so the lock is free for anyone at once
// after the holder's Unlock.
func TestWaiterLeavesQueue(t *testing.T) {
	q := newQueueFixture(t)
	ctx := ctxT(t)
	holder, err := q.cs[0].NewMutex(q.name, nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	res := q.lockAsync(wctx, 1)
	q.waitQueued(t, ctx, 1)
	infos, err := q.cs[2].Inspect(ctx, q.name)
	if err != nil || len(infos) != 1 || infos[0].Waiters != 1 {
		t.Fatalf("Inspect with one waiter queued: %+v, %v; want Waiters 1", infos, err)
	}
	cancel()
	if r := <-res; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Lock: %v, want context.Canceled", r.err)
	}
	if n, _ := q.admin.Exists(ctx, q.k.Queue, q.k.Waits).Result(); n != 0 {
		t.Fatalf("the cancelled waiter is still queued (%d queue keys)", n)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := q.cs[2].NewMutex(q.name, nil).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after the waiter left: %v", err)
	}
	_ = l.Unlock(ctx)
}
