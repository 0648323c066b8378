package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"

	_ "github.com/go-sql-driver/mysql"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/mysqllock"
)

// The application's own *sql.DB, a lease-mode driver on it, and one lock.
// The fencing token goes with every write the lock protects. MYSQL_DSN is a
// go-sql-driver/mysql DSN such as app:secret@tcp(db.internal:3306)/app?tls=true
// (the package's tests set it to their server's).
func Example() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close() // the driver never closes a *sql.DB it was given

	d, err := mysqllock.New(db, nil) // ModeLease, table dlock_locks
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

// Opening by URL with GET_LOCK: the lock lives as long as its pinned
// connection, which the server closes one TTL after the last renewal.
func Example_getLock() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "mysql://app@db.internal:3306/app?tls=true&mode=getlock")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
