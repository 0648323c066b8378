package sqltest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/testwait"
)

// ServerQueueOrder checks that waiting Locks of a mutex wait in the server
// and are granted in the order they came: clients[0] holds name, each of
// clients[1:] starts a Lock once the one before it waits in the server
// (waiting, the count of sessions the server shows waiting for name's
// lock, has reached its place), and after the holder's release the grants
// come in that order, each with a token above the one before; no session
// waits afterwards.
func ServerQueueOrder(t *testing.T, clients []*dlock.Client, name string, waiting func() int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := clients[0].NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		who   int
		token uint64
	}
	n := len(clients) - 1
	grants := make(chan grant, n)
	errs := make(chan error, n)
	for i := 1; i <= n; i++ {
		go func() {
			l, err := clients[i].NewMutex(name, nil).Lock(ctx)
			if err != nil {
				errs <- err
				return
			}
			grants <- grant{i, l.Token()}
			errs <- l.Unlock(ctx)
		}()
		testwait.Until(t, 10*time.Second, fmt.Sprintf("waiter %d waiting in the server", i), func() bool { return waiting() == i })
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := held.Token()
	for want := 1; want <= n; want++ {
		g := <-grants
		if g.who != want || g.token <= last {
			t.Fatalf("grant %d went to waiter %d with token %d (previous token %d); want waiter %d, a larger token", want, g.who, g.token, last, want)
		}
		last = g.token
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if w := waiting(); w != 0 {
		t.Fatalf("%d sessions still wait in the server", w)
	}
}
