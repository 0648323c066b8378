package etcdlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// TestLostGuardReplyLeavesNoGuard: when the reply to the write of a waited
// grant's lock-delay guard is lost (the write was applied), the failed
// acquire deletes the guard with its key. It used to delete only the key:
// the guard, naming a key that no longer existed and bound to a delay lease
// its driver kept alive, blocked the lock for every other owner, and for
// the same owner's next attempt, as long as that driver lived.
func TestLostGuardReplyLeavesNoGuard(t *testing.T) {
	ctx := queuetest.Ctx(t, 60*time.Second)
	name := fmt.Sprintf("lost-guard-%d", time.Now().UnixNano())
	var lose atomic.Bool
	cliB, err := clientv3.New(clientv3.Config{
		Endpoints: shared.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if txn, ok := req.(*etcdserverpb.TxnRequest); ok && err == nil && lose.Load() && reply.(*etcdserverpb.TxnResponse).Succeeded {
				for _, op := range txn.Success {
					if p := op.GetRequestPut(); p != nil && bytes.HasSuffix(p.Key, []byte("\x00delay")) {
						return errors.New("test: the reply was lost")
					}
				}
			}
			return err
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cliB.Close() })
	dA := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	dB := newTestDriver(t, cliB, nil)
	dC := newTestDriver(t, newClient(t, shared.Endpoints()), nil)
	req := func(owner string) driver.AcquireRequest {
		r := queuetest.Req(name, owner)
		r.TTL = 10 * time.Second
		return r
	}
	gA, err := dA.Acquire(ctx, req("A"))
	if err != nil {
		t.Fatal(err)
	}
	lose.Store(true)
	rB := req("B")
	rB.LockDelay = time.Second
	done := make(chan error, 1)
	go func() {
		_, err := dB.Acquire(ctx, rB) // waits for A, then writes its guard
		done <- err
	}()
	queuetest.Eventually(t, 10*time.Second, "B queued", func() bool { return len(keys(t, dA.cli, dA.queuePrefix(name))) == 2 })
	if _, err := dA.Release(ctx, queuetest.Lease(name, "A", gA)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("B's acquire succeeded though the reply to its guard's write was lost")
	}
	lose.Store(false)
	// Well within the delay lease's TTL (12s), which dB keeps alive anyway.
	queuetest.Eventually(t, 5*time.Second, "the lock free for C", func() bool {
		g, err := dC.TryAcquire(ctx, req("C"))
		if err != nil {
			return false
		}
		if _, err := dC.Release(ctx, queuetest.Lease(name, "C", g)); err != nil {
			t.Fatal(err)
		}
		return true
	})
}
