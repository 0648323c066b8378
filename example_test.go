package dlock_test

import (
	"context"
	"errors"
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

func ExampleRWMutex() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "mem://example-rw")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	cfg := client.NewRWMutex("config", nil)
	r1, _ := cfg.RLock(ctx) // readers share
	r2, _ := cfg.RLock(ctx)
	_, err = cfg.TryLock(ctx) // a writer waits for every reader
	fmt.Println("writer while reading:", errors.Is(err, dlock.ErrLocked))
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)

	w, err := cfg.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// Every grant's token is above every earlier one of the name, so a
	// resource can fence writers (and stale readers) by token.
	fmt.Println(w.Kind(), "token above the readers':", w.Token() > r2.Token())
	_ = w.Unlock(ctx)
	// Output:
	// writer while reading: true
	// write token above the readers': true
}

func ExampleSemaphore() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "mem://example-sem")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	encoders := client.NewSemaphore("encoders", 2, nil) // at most 2 at once
	a, _ := encoders.Acquire(ctx)
	b, _ := encoders.Acquire(ctx)
	_, err = encoders.TryAcquire(ctx)
	fmt.Println("third permit:", errors.Is(err, dlock.ErrLocked))
	// Every holder must agree on the size while the semaphore is in use.
	_, err = client.NewSemaphore("encoders", 3, nil).TryAcquire(ctx)
	fmt.Println("another size:", errors.Is(err, dlock.ErrInvalid))
	_ = a.Unlock(ctx)
	_ = b.Unlock(ctx)
	// Output:
	// third permit: true
	// another size: true
}

func ExampleMultiMutex() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "mem://example-multi")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// Move money between two accounts: both locks or none, taken in sorted
	// order, so a transfer the other way round cannot deadlock with this one.
	ml, err := client.NewMultiMutex([]string{"accounts/9", "accounts/1"}, nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ml.Names(), ml.Tokens())
	// Each part is the Mutex of its name.
	_, err = client.NewMutex("accounts/9", nil).TryLock(ctx)
	fmt.Println("accounts/9 alone:", errors.Is(err, dlock.ErrLocked))
	_ = ml.Unlock(ctx)
	// Output:
	// [accounts/1 accounts/9] [1 1]
	// accounts/9 alone: true
}
