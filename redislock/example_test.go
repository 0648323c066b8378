package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/redislock"
)

// A lock over a go-redis client the program already has. The fencing token
// goes with every write the lock protects. REDIS_URL is the server's URL,
// such as redis://:secret@localhost:6379/0 (the package's tests set it to
// their server's).
func Example() {
	ctx := context.Background()
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true // context deadlines bound every wait
	opt.MaxRetries = -1              // a lost reply is an unknown outcome, not a retry
	rdb := redis.NewClient(opt)
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
	// the lease ends (lease.Done, lease.Context).
	fmt.Println("holding orders/42 with a fencing token:", lease.Token() > 0)

	_, err = client.NewMutex("orders/42", nil).TryLock(ctx)
	fmt.Println("a second TryLock:", errors.Is(err, dlock.ErrLocked))
	// Output:
	// holding orders/42 with a fencing token: true
	// a second TryLock: true
}

// Opening by URL: redis:// or rediss:// (TLS), with the driver's key_prefix
// and any go-redis parameter (pool_size, …); ttl and the other client-wide
// parameters set dlock.Options. Errors never contain the URL's password.
func Example_url() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, os.Getenv("REDIS_URL")+"?key_prefix=myapp:&ttl=10s&pool_size=20")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		// ctx ends if the lease is lost.
		fmt.Println("running with a fencing token:", l.Token() > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// running with a fencing token: true
}
