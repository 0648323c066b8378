package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/pglock"
)

// The application's own pool, a lease-mode driver on it, and one lock. The
// fencing token goes with every write the lock protects. DATABASE_URL is a
// PostgreSQL URL such as postgres://app@db.internal:5432/app?sslmode=verify-full
// (the package's tests set it to their server's).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // the driver never closes a pool it was given

	d, err := pglock.New(pool, &pglock.Options{Mode: pglock.ModeLease})
	if err != nil {
		log.Fatal(err)
	}
	client := dlock.New(d, nil)
	defer client.Close()

	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(context.Background())
	fmt.Println("holding orders/42 with a fencing token:", lease.Token() > 0)

	_, err = client.NewMutex("orders/42", nil).TryLock(ctx)
	fmt.Println("a second TryLock:", errors.Is(err, dlock.ErrLocked))
	// Output:
	// holding orders/42 with a fencing token: true
	// a second TryLock: true
}

// Opening by URL: mode and table are the driver's parameters, the rest
// (sslmode, pool_max_conns, …) go to pgx.
func Example_advisory() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "postgres://app@db.internal:5432/app?sslmode=require&mode=advisory")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		// ctx is cancelled if the pinned connection dies.
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
