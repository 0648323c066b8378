package sqlitelock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/dlock/dlock"
	_ "github.com/dlock/dlock/sqlitelock" // registers sqlite://
)

// Two clients on one file, as two processes would be: the second cannot
// take the lock until the first releases it, and then gets a larger token.
func Example() {
	dir, _ := os.MkdirTemp("", "dlock-example")
	defer os.RemoveAll(dir)
	url := "sqlite://" + filepath.Join(dir, "locks.db")
	ctx := context.Background()

	a, err := dlock.Open(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := dlock.Open(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	la, _ := a.NewMutex("nightly-report", nil).TryLock(ctx)
	fmt.Println("a holds it with token", la.Token())
	_, err = b.NewMutex("nightly-report", nil).TryLock(ctx)
	fmt.Println("b locked out:", errors.Is(err, dlock.ErrLocked))
	_ = la.Unlock(ctx)
	lb, _ := b.NewMutex("nightly-report", nil).TryLock(ctx)
	fmt.Println("b holds it with token", lb.Token())
	_ = lb.Unlock(ctx)
	// Output:
	// a holds it with token 1
	// b locked out: true
	// b holds it with token 2
}
