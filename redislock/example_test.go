package redislock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redislock"
)

// A lock over a go-redis client the program already has. The example needs a
// Redis server on localhost:6379, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  "localhost:6379",
		ContextTimeoutEnabled: true, // context deadlines bound every wait
		MaxRetries:            -1,   // a lost reply is an unknown outcome, not a retry
	})
	defer rdb.Close() // the driver never closes a client it was given

	d, err := redislock.New(rdb, &redislock.Options{KeyPrefix: "myapp:"})
	if err != nil {
		log.Fatal(err)
	}
	client := dlock.New(d, &dlock.Options{TTL: 10 * time.Second})
	defer client.Close()

	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)
	// Pass the fencing token to whatever the lock protects, and stop when
	// the lease ends.
	fmt.Println("holding orders/42 with token", lease.Token())
	select {
	case <-lease.Done():
		log.Print("lease lost: ", lease.Err())
	case <-time.After(time.Second): // the work
	}
}

// Opening by URL: redis:// or rediss:// (TLS), with the driver's key_prefix
// and any go-redis parameter; ttl and the other client-wide parameters set
// dlock.Options.
func Example_url() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "redis://:secret@localhost:6379/0?key_prefix=myapp:&ttl=10s&pool_size=20")
	if err != nil {
		log.Fatal(err) // never contains the password
	}
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		fmt.Println("running with token", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
