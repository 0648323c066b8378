package redisscript

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/internal/testserver"
	"github.com/dlock/dlock/internal/testwait"
)

// TestNoGrantMessageWithoutListener: a granting release whose waiter's
// grant channel has no subscriber on the server makes no grant and
// publishes no grant message. The message would still travel: a PUBLISH
// reaches the server's replicas (and, in a cluster, every node), so a
// driver listening on a replica (its connection not yet moved after a
// failover) would hear of a grant that was undone, and hold a lock
// nobody had granted it. Here the waiter's driver listens on a replica.
func TestNoGrantMessageWithoutListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srvs := testserver.RedisN(t, 2, nil)
	master := redis.NewClient(&redis.Options{Addr: srvs[0].Addr()})
	defer master.Close()
	replica := redis.NewClient(&redis.Options{Addr: srvs[1].Addr()})
	defer replica.Close()
	host, port, err := net.SplitHostPort(srvs[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := replica.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "the replica's link to the master", func() bool {
		info, err := replica.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	const grantCh = "test:grant:replica"
	sub := replica.Subscribe(ctx, grantCh)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	k := KeysFor(DefaultPrefix, "no-listener")
	if r, err := Acquire(ctx, master, k, "h", 10*time.Second, 0); err != nil || !r.Granted {
		t.Fatalf("h's acquire: %+v, %v", r, err)
	}
	if r, _, err := AcquireWaiting(ctx, master, k, "w", 10*time.Second, 0, 3*time.Second, 0, grantCh); err != nil || r.Granted {
		t.Fatalf("w's waiting acquire: %+v, %v", r, err)
	}
	if _, held, err := ReleaseGranting(ctx, master, k, "h", 0); err != nil || !held {
		t.Fatalf("h's release: held %v, %v", held, err)
	}
	if n, err := master.Exists(ctx, k.Lock).Result(); err != nil || n != 0 {
		t.Fatalf("the lock exists (%d, %v) after a release whose waiter does not listen on the master", n, err)
	}
	// The marker goes through the replication stream after the
	// release's effects: whatever the release published reaches the
	// replica's subscriber before it.
	const marker = "marker"
	if err := master.Publish(ctx, grantCh, marker).Err(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Payload == marker {
			return
		}
		t.Fatalf("the replica's subscriber got %q: a grant message for a grant the release did not keep", m.Payload)
	}
}
