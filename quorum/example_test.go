package quorum_test

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/quorum"
	"github.com/dlock/dlock/sqlitelock"
)

// A quorum of three nodes opened from a URL, each node's URL query-escaped.
// Here they are three SQLite files so that the example runs anywhere; in
// production they are independent servers (redis://, postgres://, …) on
// different machines.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "quorum-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	raw := "quorum:?ttl=10s"
	for _, f := range []string{"a.db", "b.db", "c.db"} {
		raw += "&node=" + url.QueryEscape("sqlite://"+filepath.Join(dir, f))
	}
	client, err := dlock.Open(ctx, raw)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err) // with fewer than 2 of 3 nodes reachable: an error, never a grant
	}
	fmt.Println("token", lease.Token())
	_ = lease.Unlock(ctx)

	lease, err = client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("token", lease.Token())
	_ = lease.Unlock(ctx)
	// Output:
	// token 1
	// token 2
}

// New builds a quorum over drivers the program opened itself; the quorum
// driver owns them and closes them.
func ExampleNew() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "quorum-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	var nodes []driver.Driver
	for _, f := range []string{"a.db", "b.db", "c.db"} {
		u, _ := url.Parse("sqlite://" + filepath.Join(dir, f))
		d, err := sqlitelock.OpenURL(ctx, u)
		if err != nil {
			log.Fatal(err)
		}
		nodes = append(nodes, d)
	}
	d, err := quorum.New(nodes, &quorum.Options{NodeTimeout: 200 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	client := dlock.New(d, &dlock.Options{TTL: 10 * time.Second})
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		fmt.Println("holding with token", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: holding with token 1
}
