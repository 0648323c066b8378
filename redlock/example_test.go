package redlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
)

// Redlock over three independent Redis masters. The example needs those
// servers, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	var clients []redis.UniversalClient
	for _, addr := range []string{"redis-a:6379", "redis-b:6379", "redis-c:6379"} {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		defer c.Close() // the driver never closes clients it was given
		clients = append(clients, c)
	}
	d, err := redlock.New(clients, &redlock.Options{NodeTimeout: 50 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	client := dlock.New(d, &dlock.Options{TTL: 10 * time.Second})
	defer client.Close()

	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err) // with fewer than 2 of 3 nodes reachable: an error, never a grant
	}
	defer lease.Unlock(ctx)
	fmt.Println("holding orders/42 on a quorum with token", lease.Token())
}

// Opening by URL: the nodes are listed in the host part.
func Example_url() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "redlock://redis-a:6379,redis-b:6379,redis-c:6379/0?node_timeout=50ms&ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	l, err := client.NewMutex("nightly-report", nil).TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
}
