package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redlock"
)

// Redlock over go-redis clients of three independent Redis masters.
// REDIS_ADDRS lists them, such as redis-a:6379,redis-b:6379,redis-c:6379
// (the package's tests set it to their servers').
func Example() {
	ctx := context.Background()
	var clients []redis.UniversalClient
	for _, addr := range strings.Split(os.Getenv("REDIS_ADDRS"), ",") {
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
	fmt.Printf("holding orders/42 on %d of %d nodes with a fencing token: %v\n", d.Quorum(), len(clients), lease.Token() > 0)

	_, err = client.NewMutex("orders/42", nil).TryLock(ctx)
	fmt.Println("a second TryLock:", errors.Is(err, dlock.ErrLocked))
	// Output:
	// holding orders/42 on 2 of 3 nodes with a fencing token: true
	// a second TryLock: true
}

// Opening by URL: the nodes are listed in the host part; node_timeout and
// key_prefix are the driver's parameters, ttl and the other client-wide
// ones set dlock.Options.
func Example_url() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "redlock://"+os.Getenv("REDIS_ADDRS")+"/0?node_timeout=50ms&ttl=10s")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	l, err := client.NewMutex("nightly-report", nil).TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Unlock(ctx)
	fmt.Println("holding nightly-report with a fencing token:", l.Token() > 0)
	// Output:
	// holding nightly-report with a fencing token: true
}
