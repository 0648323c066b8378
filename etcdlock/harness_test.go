package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/locktest"
)

// testTTL is the lease TTL of the conformance runs: etcd's minimum with the
// test servers' 1s election timeout.
const testTTL = 2 * time.Second

type harness struct {
	endpoints []string
	admin     *clientv3.Client
}

func newHarness(members int) locktest.NewHarness {
	return func(ctx context.Context, t testing.TB) (locktest.Harness, error) {
		c := shared
		if members > 1 {
			c = testserver.Etcd(t, members)
		}
		admin, err := dial(c.Endpoints())
		if err != nil {
			return nil, err
		}
		return &harness{endpoints: c.Endpoints(), admin: admin}, nil
	}
}

func dial(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func (h *harness) NewDriver(ctx context.Context) (driver.Driver, error) {
	cli, err := dial(h.endpoints)
	if err != nil {
		return nil, err
	}
	return newDriver(cli, true, nil)
}

// Kill stops the keepalives and closes the client without revoking the
// lease, so the server frees the locks only when the lease expires.
func (h *harness) Kill(d driver.Driver) error {
	ed, ok := d.(*Driver)
	if !ok {
		return fmt.Errorf("not an etcdlock driver: %T", d)
	}
	ed.stop()
	return ed.cli.Close()
}

// Drop deletes the holder's key (the oldest in the queue), as if its lease
// had expired; create revisions keep increasing, so tokens survive.
func (h *harness) Drop(ctx context.Context, name string) error {
	d := &Driver{}
	resp, err := h.admin.Get(ctx, d.queuePrefix(name), clientv3.WithFirstCreate()...)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return errors.New("no holder to drop")
	}
	_, err = h.admin.Delete(ctx, string(resp.Kvs[0].Key))
	return err
}

// DropKind deletes the keys of the current holders of kind k on name (the
// readers older than the first writer, the writer at the head, or the
// oldest keys up to the semaphore's size) and their lock-delay guards, as
// if their leases had expired and their delays run out.
func (h *harness) DropKind(ctx context.Context, name string, k driver.Kind) error {
	d := &Driver{}
	base, guards := d.kindBase(k, name)
	resp, err := h.admin.Get(ctx, base, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return err
	}
	var drop []string
	for i, kv := range resp.Kvs {
		rel := strings.TrimPrefix(string(kv.Key), base)
		switch k {
		case driver.Read:
			if strings.HasPrefix(rel, "w/") {
				i = len(resp.Kvs)
			}
		case driver.Write:
			if i > 0 || !strings.HasPrefix(rel, "w/") {
				i = len(resp.Kvs)
			}
		case driver.Permit:
			if n, _, ok := parseSemValue(resp.Kvs[0].Value); !ok || i >= n {
				i = len(resp.Kvs)
			}
		}
		if i == len(resp.Kvs) {
			break
		}
		drop = append(drop, string(kv.Key), guards+rel)
	}
	if len(drop) == 0 {
		return fmt.Errorf("no %v holder of %q to drop", k, name)
	}
	ops := make([]clientv3.Op, len(drop))
	for i, key := range drop {
		ops[i] = clientv3.OpDelete(key)
	}
	_, err = h.admin.Txn(ctx).Then(ops...).Commit()
	return err
}

var _ locktest.KindDropper = (*harness)(nil)

func (h *harness) Config() locktest.Config {
	return locktest.Config{TTL: testTTL, SessionBound: true, LockDelay: true}
}

func (h *harness) Close() { h.admin.Close() }

// AcquireReleaseFloor: a put-if-absent transaction bound to a lease, then a
// delete, on a client of its own.
func (h *harness) AcquireReleaseFloor(ctx context.Context) (func(context.Context, string) error, func(), error) {
	cli, err := dial(h.endpoints)
	if err != nil {
		return nil, nil, err
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	op := func(ctx context.Context, key string) error {
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, "x", clientv3.WithLease(lease.ID))).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return errors.New("floor key exists")
		}
		_, err = cli.Delete(ctx, key)
		return err
	}
	return op, func() { cli.Revoke(context.Background(), lease.ID); cli.Close() }, nil
}

// RoundTripFloor: one raw write.
func (h *harness) RoundTripFloor(ctx context.Context) (func(context.Context) error, func(), error) {
	cli, err := dial(h.endpoints)
	if err != nil {
		return nil, nil, err
	}
	op := func(ctx context.Context) error {
		_, err := cli.Put(ctx, "\x00dlock-bench-rtt", "x")
		return err
	}
	return op, func() { cli.Close() }, nil
}

var _ locktest.Floors = (*harness)(nil)

func TestConformance(t *testing.T) {
	locktest.RunConformanceTests(t, newHarness(1))
}

func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("3-member cluster: skipped in -short mode")
	}
	locktest.RunConformanceTests(t, newHarness(3))
}

func BenchmarkLocks(b *testing.B) {
	locktest.RunBenchmarks(b, newHarness(1))
}

// BenchmarkConcurrencyMutexHotLock is the hot-lock hand-off scenario of
// locktest.RunBenchmarks with etcd's own concurrency.Mutex, for comparison in
// the same run: contenders goroutines over 4 clients, each with a session of
// its own, hand one lock around.
func BenchmarkConcurrencyMutexHotLock(b *testing.B) {
	h := &harness{endpoints: shared.Endpoints()}
	queuetest.NativeHotLock(b, h.RoundTripFloor, func(b *testing.B, n int) (lock, unlock func(g int) error) {
		ctx := context.Background()
		clis := make([]*clientv3.Client, 4)
		for i := range clis {
			clis[i] = newClient(b, shared.Endpoints())
		}
		name := fmt.Sprintf("bench-native-%d-%d", n, time.Now().UnixNano())
		mutexes := make([]*concurrency.Mutex, n)
		for g := range mutexes {
			s, err := concurrency.NewSession(clis[g%len(clis)], concurrency.WithTTL(30))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			mutexes[g] = concurrency.NewMutex(s, name)
		}
		return func(g int) error { return mutexes[g].Lock(ctx) }, func(g int) error { return mutexes[g].Unlock(ctx) }
	})
}

// BenchmarkUncontended compares one uncontended Lock+Unlock through a dlock
// Client (client) or the bare driver (driver) with etcd's concurrency.Mutex
// and with the raw floor (a put-if-absent transaction and a delete),
// interleaved in the same run (see queuetest.Uncontended).
func BenchmarkUncontended(b *testing.B) {
	name, floor, peer := uncontendedFloorAndPeer(b, "bench-uncontended")
	queuetest.UncontendedClientAndDriver(b, name, 30*time.Second, func(t testing.TB) queuetest.Driver { return newTestDriver(t, newClient(t, shared.Endpoints()), nil) }, floor, peer)
}

// uncontendedFloorAndPeer returns a fresh lock name with the given prefix,
// the raw floor (a put-if-absent transaction and a delete) and one
// concurrency.Mutex Lock+Unlock, on names derived from it; what they set
// up is undone at the end of b.
func uncontendedFloorAndPeer(b *testing.B, prefix string) (name string, floor, peer func(context.Context) error) {
	h := &harness{endpoints: shared.Endpoints()}
	floorOp, cleanup, err := h.AcquireReleaseFloor(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cleanup)
	name = fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	floor = func(ctx context.Context) error { return floorOp(ctx, name+"-floor") }
	s, err := concurrency.NewSession(newClient(b, shared.Endpoints()), concurrency.WithTTL(30))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	m := concurrency.NewMutex(s, name+"-peer")
	peer = func(ctx context.Context) error {
		if err := m.Lock(ctx); err != nil {
			return err
		}
		return m.Unlock(ctx)
	}
	return name, floor, peer
}

// BenchmarkLockCostGrowth locks and unlocks one name through a dlock Client
// (a random owner per Lock, as by default) max(b.N, 2000) times, without
// compaction, and reports the cost of the last 1000 cycles against the
// first 1000 (see queuetest.Growth). Run it with -benchtime=100000x.
func BenchmarkLockCostGrowth(b *testing.B) {
	c := dlock.New(newTestDriver(b, newClient(b, shared.Endpoints()), nil), &dlock.Options{TTL: 30 * time.Second})
	defer c.Close()
	mu := c.NewMutex(fmt.Sprintf("bench-growth-%d", time.Now().UnixNano()), nil)
	queuetest.Growth(b, func(ctx context.Context) error {
		l, err := mu.Lock(ctx)
		if err != nil {
			return err
		}
		return l.Unlock(ctx)
	})
}
