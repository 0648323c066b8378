package testserver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock/dlock/internal/testserver"
)

func etcdClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestEtcdClientCompat runs what dlock's etcd driver needs (leases, keep-alive,
// transactions on create revisions, watches, the concurrency package) with
// the pinned client v3.7 against the etcd server this package starts.
func TestEtcdClientCompat(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := testserver.Etcd(t, 1)
	t.Logf("etcd (1 member) started in %v", time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := etcdClient(t, cl.Endpoints())

	st, err := c.Status(ctx, cl.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server version %s", st.Version)

	lease, err := c.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := c.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ka:
		if r == nil || r.TTL <= 0 {
			t.Fatalf("keep-alive answered %+v", r)
		}
	case <-ctx.Done():
		t.Fatal("no keep-alive answer")
	}
	tx, err := c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision("lock/a"), "=", 0)).
		Then(clientv3.OpPut("lock/a", "owner", clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet("lock/a")).Commit()
	if err != nil || !tx.Succeeded {
		t.Fatalf("txn: succeeded=%v err=%v", tx != nil && tx.Succeeded, err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := c.Watch(wctx, "lock/a", clientv3.WithRev(tx.Header.Revision+1))
	if _, err := c.Delete(ctx, "lock/a"); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wch:
		if err := wr.Err(); err != nil || len(wr.Events) != 1 || wr.Events[0].Type != clientv3.EventTypeDelete {
			t.Fatalf("watch: %+v, %v", wr.Events, err)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	wcancel()

	s1, err := concurrency.NewSession(c, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	m := concurrency.NewMutex(s1, "mu")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := concurrency.NewSession(c, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := concurrency.NewMutex(s2, "mu").TryLock(ctx); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("TryLock on a held mutex: %v, want ErrLocked", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
}

func TestEtcdKillRestart(t *testing.T) {
	t.Parallel()
	cl := testserver.Etcd(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := etcdClient(t, cl.Endpoints())
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if i, err := cl.Leader(); err != nil || i != 0 {
		t.Fatalf("Leader() = %d, %v; want 0", i, err)
	}
	m := cl.Members[0]
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Leader(); err == nil {
		t.Fatal("Leader() found a leader with the only member killed")
	}
	if err := m.Restart(false); err != nil {
		t.Fatal(err)
	}
	// etcd fsyncs before acknowledging: the write survives the crash.
	if r, err := c.Get(ctx, "k"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("Get k after kill+restart: %v, %v", r, err)
	}
	if err := m.Restart(true); err != nil {
		t.Fatal(err)
	}
	c2 := etcdClient(t, cl.Endpoints())
	if r, err := c2.Get(ctx, "k"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("Get k after a wiped restart: %v, %v; want no keys", r, err)
	}
}

func TestEtcdCluster3(t *testing.T) {
	t.Parallel()
	start := time.Now()
	cl := testserver.Etcd(t, 3)
	t.Logf("etcd (3 members) started in %v", time.Since(start))
	if got := len(cl.Endpoints()); got != 3 {
		t.Fatalf("%d endpoints, want 3", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := etcdClient(t, cl.Endpoints())
	if _, err := c.Put(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}
	leader, err := cl.Leader()
	if err != nil {
		t.Fatal(err)
	}
	// Kill the leader: the other two elect a new one and keep serving.
	if err := cl.Members[leader].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, func() error {
		l, err := cl.Leader()
		if err != nil {
			return err
		}
		if l == leader {
			return fmt.Errorf("old leader %d still named", l)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Members[leader].Restart(false); err != nil {
		t.Fatal(err)
	}
	// The restarted member catches up: a read served by it alone sees v2.
	one := etcdClient(t, []string{cl.Members[leader].Addr()})
	if err := waitFor(ctx, func() error {
		r, err := one.Get(ctx, "k", clientv3.WithSerializable())
		if err != nil {
			return err
		}
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v2" {
			return fmt.Errorf("restarted member has %v", r.Kvs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Pause a follower: the cluster keeps its quorum.
	leader, err = cl.Leader()
	if err != nil {
		t.Fatal(err)
	}
	f := (leader + 1) % 3
	if err := cl.Members[f].Pause(); err != nil {
		t.Fatal(err)
	}
	viaLeader := etcdClient(t, []string{cl.Members[leader].Addr()})
	if _, err := viaLeader.Put(ctx, "k", "v3"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Members[f].Resume(); err != nil {
		t.Fatal(err)
	}

	// A wiped member comes back empty and is refilled by the others.
	if err := cl.Members[f].Restart(true); err != nil {
		t.Fatal(err)
	}
	one2 := etcdClient(t, []string{cl.Members[f].Addr()})
	if err := waitFor(ctx, func() error {
		r, err := one2.Get(ctx, "k", clientv3.WithSerializable())
		if err != nil {
			return err
		}
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v3" {
			return fmt.Errorf("wiped member has %v", r.Kvs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Whole-cluster crash and restart keeps the data.
	for _, m := range cl.Members {
		if err := m.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Restart(false); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Get(ctx, "k"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v3" {
		t.Fatalf("after a whole-cluster restart: %v, %v", r, err)
	}

	// A whole-cluster wipe gives a new, empty cluster on the same ports.
	if err := cl.Restart(true); err != nil {
		t.Fatal(err)
	}
	fresh := etcdClient(t, cl.Endpoints())
	if err := waitFor(ctx, func() error {
		r, err := fresh.Get(ctx, "k")
		if err != nil {
			return err
		}
		if len(r.Kvs) != 0 {
			return fmt.Errorf("k survived a wipe: %v", r.Kvs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it returns nil or ctx ends.
func waitFor(ctx context.Context, cond func() error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("condition not met in time: %w", err)
		case <-tick.C:
		}
	}
}
