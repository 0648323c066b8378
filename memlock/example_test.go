package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/memlock"
)

// Two clients of one in-process backend contend for a lock, as two processes
// would on a real server.
func Example() {
	ctx := context.Background()
	backend := memlock.NewBackend() // the "server"
	a := dlock.New(backend.NewDriver(), nil)
	defer a.Close()
	b := dlock.New(backend.NewDriver(), nil)
	defer b.Close()

	lease, err := a.NewMutex("jobs/nightly", nil).TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("a holds it, token", lease.Token())
	_, err = b.NewMutex("jobs/nightly", nil).TryLock(ctx)
	fmt.Println("b is locked out:", errors.Is(err, dlock.ErrLocked))

	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	next, err := b.NewMutex("jobs/nightly", nil).TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("b holds it, token", next.Token())
	owner, token := backend.Holder("jobs/nightly")
	fmt.Println("the server agrees:", owner == next.Owner(), token)
	// Output:
	// a holds it, token 1
	// b is locked out: true
	// b holds it, token 2
	// the server agrees: true 2
}
