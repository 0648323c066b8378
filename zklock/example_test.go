package zklock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/zklock"
)

// Example takes a lock through the application's own ZooKeeper connection.
// The lock "orders/42" lives at /locks/orders/42, where Python kazoo's
// client.Lock("/locks/orders/42") queues in the same line. A driver made
// with New serves one TTL, its connection's session timeout as the server
// granted it, so the client asks for that TTL. ZK_SERVERS lists the
// ensemble, such as 10.0.0.1:2181,10.0.0.2:2181 (the package's tests set it
// to their server's, which grants session timeouts up to 3s).
func Example() {
	const ttl = 2 * time.Second
	conn, _, err := zk.Connect(strings.Split(os.Getenv("ZK_SERVERS"), ","), ttl, zk.WithLogInfo(false))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close() // the driver never closes a connection it was given

	d, err := zklock.New(conn, &zklock.Options{Root: "/locks", SessionTimeout: ttl})
	if err != nil {
		log.Fatal(err)
	}
	client := dlock.New(d, &dlock.Options{TTL: ttl})
	defer client.Close()

	ctx := context.Background()
	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// The token is the node's czxid. lease.Context() ends if the session
	// expires.
	fmt.Println("holding orders/42 with a fencing token:", lease.Token() > 0)
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: holding orders/42 with a fencing token: true
}

// Example_url opens the driver from a URL with digest auth and nodes only
// their creator may touch. Each distinct TTL gets a ZooKeeper session with
// that timeout; a TTL the ensemble does not grant is refused with an error
// wrapping dlock.ErrInvalid.
func Example_url() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "zk://app:secret@"+os.Getenv("ZK_SERVERS")+"/applocks?acl=creator&session_timeout=2s&ttl=2s")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lease, err := client.NewMutex("nightly-report", nil).TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("running the nightly report")
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: running the nightly report
}
