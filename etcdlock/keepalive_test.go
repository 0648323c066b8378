package etcdlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// countingClient is a client on the shared server that counts the
// keepalives it sends: every KeepAliveOnce opens one LeaseKeepAlive stream.
func countingClient(t *testing.T) (*clientv3.Client, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == "/etcdserverpb.Lease/LeaseKeepAlive" {
			n.Add(1)
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   shared.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(count)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, &n
}

// TestRenewedLeaseIsKeptAliveOnce: a lock renewed by the dlock package every
// TTL/3 costs one keepalive per renewal. The driver's own loop used to send
// one every TTL/3 as well, and each Renew another: twice the keepalives.
func TestRenewedLeaseIsKeptAliveOnce(t *testing.T) {
	cli, sent := countingClient(t)
	d, err := New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(d, &dlock.Options{TTL: testTTL})
	defer c.Close()
	ctx := queuetest.Ctx(t, 20*time.Second)
	l, err := c.NewMutex("keepalive-once", nil).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ttl := onlySession(t, d).ttl
	// Count over a window of 6 renewal intervals (2 TTLs).
	const intervals = 6
	before := sent.Load()
	time.Sleep(intervals * ttl / 3) // the window being measured, not a wait for a condition
	got := sent.Load() - before
	if err := l.Err(); err != nil {
		t.Fatalf("the lease ended while renewed: %v", err)
	}
	// One keepalive per renewal, and one spare for the window's edges and a
	// retry; the double keepalive sent about 2*intervals.
	t.Logf("%d keepalives in %d renewal intervals", got, intervals)
	if got > intervals+2 {
		t.Fatalf("%d keepalives in %d renewal intervals, want at most %d: the lease is kept alive twice", got, intervals, intervals+2)
	}
	if got < intervals/2 {
		t.Fatalf("%d keepalives in %d renewal intervals: the lease is not kept alive", got, intervals)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRenewSendsAKeepalive: Renew reports a lease alive only from a
// keepalive sent after Renew was called, never from the keepalive loop's
// earlier state (the dlock package counts the validity from its call), and
// concurrent calls share keepalives rather than each sending one.
func TestRenewSendsAKeepalive(t *testing.T) {
	cli, sent := countingClient(t)
	d := newTestDriver(t, cli, nil)
	ctx := queuetest.Ctx(t, 10*time.Second)
	g, err := d.TryAcquire(ctx, reqTTL("renew-sends", "A", testTTL))
	if err != nil {
		t.Fatal(err)
	}
	s := onlySession(t, d)
	for range 3 {
		before := sent.Load()
		call := time.Now()
		errs, err := d.Renew(ctx, []driver.Lease{queuetest.Lease("renew-sends", "A", g)})
		if err != nil || errs[0] != nil {
			t.Fatalf("Renew: %v %v", err, errs)
		}
		if sent.Load() == before {
			t.Fatal("Renew reported the lease alive without sending a keepalive")
		}
		if at := s.RefreshedAt(); at.Before(call) {
			t.Fatalf("after Renew the lease was last confirmed by a keepalive sent %v before the call", call.Sub(at))
		}
	}
	// 8 concurrent calls: each is answered by a keepalive sent after it
	// began, and calls that arrive before the loop sends share one.
	const calls = 8
	before := sent.Load()
	errc := make(chan error, calls)
	for range calls {
		go func() {
			errs, err := d.Renew(ctx, []driver.Lease{queuetest.Lease("renew-sends", "A", g)})
			if err == nil {
				err = errs[0]
			}
			errc <- err
		}()
	}
	for range calls {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if n := sent.Load() - before; n == 0 || n >= calls {
		t.Fatalf("%d concurrent Renew calls sent %d keepalives, want at least one and fewer than one each", calls, n)
	}
	if _, err := d.Release(ctx, queuetest.Lease("renew-sends", "A", g)); err != nil {
		t.Fatal(err)
	}
}
