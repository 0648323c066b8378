package dlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/dlock/dlock"
	_ "github.com/dlock/dlock/memlock" // registers mem://
)

func Example() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "mem://example") // or sqlite://, redis://, etcd://, …
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	mu := client.NewMutex("orders/42", nil)
	lease, err := mu.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// Hand lease.Context() to the protected work: it is cancelled if the
	// lease is lost. Pass lease.Token() to the resource you write.
	fmt.Println("token:", lease.Token())
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released:", lease.Err())
	// Output:
	// token: 1
	// released: dlock: lease released
}

func ExampleClient_Do() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "mem://example-do")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		fmt.Println("running with token", l.Token())
		return nil // ctx is cancelled if the lease is lost while this runs
	})
	fmt.Println("err:", err)
	// Output:
	// running with token 1
	// err: <nil>
}
