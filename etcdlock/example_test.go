package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcdlock"
)

// Example takes a lock through the application's own etcd client. Its queue
// keys live under /locks/orders/42/, where `etcdctl lock /locks/orders/42`
// queues too.
// ETCD_ENDPOINTS lists the cluster's members, such as
// 10.0.0.1:2379,10.0.0.2:2379 (the package's tests set it to their
// server's).
func Example() {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(os.Getenv("ETCD_ENDPOINTS"), ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close() // the driver never closes a client it was given

	d, err := etcdlock.New(cli, &etcdlock.Options{Prefix: "/locks/"})
	if err != nil {
		log.Fatal(err)
	}
	// Each lock's etcd lease has the lock's TTL (whole seconds): a holder
	// that dies frees its locks about 10s later.
	client := dlock.New(d, &dlock.Options{TTL: 10 * time.Second})
	defer client.Close()

	ctx := context.Background()
	lease, err := client.NewMutex("orders/42", nil).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// The token is the key's create revision: hand it to the resource so it
	// can refuse a stale holder. lease.Context() ends if the etcd lease does.
	fmt.Println("holding orders/42 with a fencing token:", lease.Token() > 0)
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: holding orders/42 with a fencing token: true
}

// Example_url opens the driver from a URL: the cluster's endpoints, the
// prefix "locks/" and a lock TTL (hence etcd lease TTL) of 15s. The driver
// has its own etcd client, which client.Close closes.
func Example_url() {
	ctx := context.Background()
	client, err := dlock.Open(ctx, "etcd://"+os.Getenv("ETCD_ENDPOINTS")+"/locks/?ttl=15s")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		fmt.Println("running the nightly report")
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: running the nightly report
}
