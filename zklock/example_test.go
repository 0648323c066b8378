package zklock_test

import (
	"context"
	"log"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zklock"
)

// Example takes a lock through the user's own ZooKeeper connection. The lock
// "orders/42" lives at /locks/orders/42, where Python kazoo's
// client.Lock("/locks/orders/42") queues in the same line.
func Example() {
	conn, _, err := zk.Connect([]string{"127.0.0.1:2181"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	d, err := zklock.New(conn, &zklock.Options{Root: "/locks", SessionTimeout: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	client := dlock.New(d, nil)
	defer client.Close()

	ctx := context.Background()
	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(context.Background())

	// The token is the node's czxid. lease.Context() ends if the session
	// expires.
	log.Printf("holding orders/42 with token %d", lease.Token())
	<-lease.Context().Done()
}

// Example_url opens the driver from a URL with digest auth and nodes only
// their creator may touch.
func Example_url() {
	client, err := dlock.Open(context.Background(), "zk://app:secret@10.0.0.1:2181,10.0.0.2:2181/locks?acl=creator&session_timeout=15s")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lease, err := client.NewMutex("nightly-report", nil).TryLock(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(context.Background())
}
