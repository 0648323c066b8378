package etcdlock_test

import (
	"context"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/etcdlock"
)

// Example takes a lock through the user's own etcd client. Its queue keys
// live under /locks/orders%2F42/ (a '/' in a name is escaped).
func Example() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	d, err := etcdlock.New(cli, &etcdlock.Options{Prefix: "/locks/", SessionTTL: 10 * time.Second})
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

	// The token is the key's create revision: hand it to the resource so it
	// can refuse a stale holder. lease.Context() ends if the etcd lease does.
	log.Printf("holding orders/42 with token %d", lease.Token())
	<-lease.Context().Done()
}

// Example_url opens the driver from a URL: two endpoints, the prefix
// "locks/" and a 15s session.
func Example_url() {
	client, err := dlock.Open(context.Background(), "etcd://10.0.0.1:2379,10.0.0.2:2379/locks/?session_ttl=15s")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(context.Background(), "nightly-report", nil, func(ctx context.Context, l *dlock.Lease) error {
		log.Printf("running with token %d", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
