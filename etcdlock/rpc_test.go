package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/locktest"
)

// rpcCounter counts the gRPC calls of an etcd client by method.
type rpcCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *rpcCounter) add(method string) {
	c.mu.Lock()
	c.n[method]++
	c.mu.Unlock()
}

// take returns the counts since the last take and starts again.
func (c *rpcCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// rpcClient is a client on the shared server whose unary calls and streams c
// counts by method, and its unary calls with a deadline once more as "with a
// deadline: <method>".
func rpcClient(t testing.TB, c *rpcCounter) *clientv3.Client {
	t.Helper()
	c.n = map[string]int{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				c.add(method)
				if _, ok := ctx.Deadline(); ok {
					c.add("with a deadline: " + method)
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				c.add(method)
				return streamer(ctx, desc, cc, method, opts...)
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestUncontendedRPCs: an uncontended Lock+Unlock through a dlock Client
// costs two requests, as etcd's concurrency.Mutex's does: the transaction
// that puts the key and reads the queue's head and the lock-delay guard,
// and the delete of the key. With a lock-delay too: the transaction that
// finds the lock free writes the key and its guard, and the release's
// transaction deletes both (the guard used to be written in a request of
// its own: three).
func TestUncontendedRPCs(t *testing.T) {
	const cycles = 20
	for _, tc := range []struct {
		delay time.Duration
		want  map[string]int
	}{
		{0, map[string]int{"/etcdserverpb.KV/Txn": cycles, "/etcdserverpb.KV/DeleteRange": cycles}},
		{time.Second, map[string]int{"/etcdserverpb.KV/Txn": 2 * cycles}},
	} {
		t.Run(fmt.Sprintf("lockdelay=%v", tc.delay), func(t *testing.T) {
			var c rpcCounter
			d := newTestDriver(t, rpcClient(t, &c), nil)
			cl := dlock.New(d, &dlock.Options{TTL: 30 * time.Second, LockDelay: tc.delay})
			defer cl.Close()
			mu := cl.NewMutex(fmt.Sprintf("rpcs-%d", time.Now().UnixNano()), nil)
			ctx := queuetest.Ctx(t, 30*time.Second)
			cycle := func() {
				l, err := mu.Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			cycle() // grants the lease (and the delay lease), starts the keepalive loop
			c.take()
			for range cycles {
				cycle()
			}
			if got := c.take(); !maps.Equal(got, tc.want) {
				t.Fatalf("%d uncontended Lock+Unlock cycles made the requests %v, want %v", cycles, got, tc.want)
			}
		})
	}
}

// TestRequestsCarryNoDeadline: the driver's requests carry no deadline (a
// deadline costs a timer on each side, see rpcctx.go), also when the
// caller's context has one and for Unlock (whose context has the Client's
// ReleaseTimeout), and a waiting Lock still ends at its context's deadline,
// its queue key removed.
func TestRequestsCarryNoDeadline(t *testing.T) {
	var c rpcCounter
	cli := rpcClient(t, &c)
	d := newTestDriver(t, cli, nil)
	cl := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
	defer cl.Close()
	name := fmt.Sprintf("deadline-%d", time.Now().UnixNano())
	mu := cl.NewMutex(name, nil)
	ctx := queuetest.Ctx(t, 30*time.Second)
	l, err := mu.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := mu.Lock(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiting Lock past its deadline: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("a waiting Lock with a 300ms deadline returned after %v", waited)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for m, n := range c.take() {
		if strings.HasPrefix(m, "with a deadline: ") {
			t.Errorf("%d requests %s", n, m)
		}
	}
	// (keys' read has a deadline of its own.)
	if ks := keys(t, cli, d.queuePrefix(name)); len(ks) != 0 {
		t.Fatalf("keys left in the queue: %q", ks)
	}
}

// BenchmarkRequestDeadline: a put-if-absent transaction and a delete, as a
// Lock+Unlock costs them, with a context without a deadline (none), with a
// deadline (deadline), and with that deadline hidden by rpcCtx (rpcctx),
// interleaved; it reports the p50 of each in µs. On etcd 3.4 over loopback a
// deadline adds about 10µs to the pair.
func BenchmarkRequestDeadline(b *testing.B) {
	cli := newClient(b, shared.Endpoints())
	base := fmt.Sprintf("bench-deadline-%d-", time.Now().UnixNano())
	variant := func(i int, wrap func(context.Context) context.Context) func() {
		key := fmt.Sprintf("%s%d", base, i)
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := wrap(ctx)
			if _, err := cli.Txn(c).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, "x")).Commit(); err != nil {
				b.Fatal(err)
			}
			if _, err := cli.Delete(c, key); err != nil {
				b.Fatal(err)
			}
		}
	}
	names := []string{"none", "deadline", "rpcctx"}
	vs := []func(){
		variant(0, func(context.Context) context.Context { return context.Background() }),
		variant(1, func(c context.Context) context.Context { return c }),
		variant(2, rpcCtx),
	}
	for range 20 {
		for _, v := range vs {
			v()
		}
	}
	ds := make([][]time.Duration, len(vs))
	b.ResetTimer()
	for n := range b.N {
		for k := range vs {
			i := (n + k) % len(vs)
			t0 := time.Now()
			vs[i]()
			ds[i] = append(ds[i], time.Since(t0))
		}
	}
	b.StopTimer()
	for i := range ds {
		b.ReportMetric(float64(locktest.Median(ds[i]).Nanoseconds())/1e3, names[i]+"-p50-µs")
	}
}

// BenchmarkUncontendedLockDelay is BenchmarkUncontended/client with a
// lock-delay: a free lock is taken with its guard in one transaction, and
// released with it in another, so it costs the two requests a Lock+Unlock
// without one costs (it used to take three).
func BenchmarkUncontendedLockDelay(b *testing.B) {
	name, floor, peer := uncontendedFloorAndPeer(b, "bench-uncontended-delay")
	c := dlock.New(newTestDriver(b, newClient(b, shared.Endpoints()), nil), &dlock.Options{TTL: 30 * time.Second, LockDelay: time.Second})
	defer c.Close()
	mu := c.NewMutex(name+"-client", nil)
	queuetest.Uncontended(b, floor, func(ctx context.Context) error {
		l, err := mu.Lock(ctx)
		if err != nil {
			return err
		}
		return l.Unlock(ctx)
	}, peer)
}
