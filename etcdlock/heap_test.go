package etcdlock

import (
	"context"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/heapbench"
	"github.com/dlock/dlock/internal/sessionlock/queuetest"
)

// BenchmarkHeapPerLease holds b.N locks (at least 1000; the goal is
// measured at -benchtime=10000x) of distinct names on one driver, through a
// dlock Client (client) and as bare driver grants (driver), each taken with
// a plain context, and reports the heap they keep alive per held lock
// (B/lease; the whole process, after a GC). Run it with -memprofile and
// -memprofilerate=1 to see what stays alive (inuse_space).
func BenchmarkHeapPerLease(b *testing.B) {
	ctx := context.Background()
	run := func(b *testing.B, take func(name string) (release func())) {
		heapbench.PerLease(b, "ETCDLOCK_HEAP_PROFILE", take)
	}
	b.Run("client", func(b *testing.B) {
		c := dlock.New(newTestDriver(b, newClient(b, shared.Endpoints()), nil), &dlock.Options{TTL: 30 * time.Second})
		defer c.Close()
		run(b, heapbench.ClientLocks(b, c, nil, false))
	})
	b.Run("client-timeout", func(b *testing.B) {
		c := dlock.New(newTestDriver(b, newClient(b, shared.Endpoints()), nil), &dlock.Options{TTL: 30 * time.Second})
		defer c.Close()
		run(b, heapbench.ClientLocks(b, c, nil, true))
	})
	b.Run("driver", func(b *testing.B) {
		d := newTestDriver(b, newClient(b, shared.Endpoints()), nil)
		run(b, func(name string) func() {
			req := queuetest.Req(name, "owner")
			req.TTL = 30 * time.Second
			g, err := d.Acquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			return func() {
				if _, err := d.Release(ctx, queuetest.Lease(name, "owner", g)); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

var _ driver.Driver = (*Driver)(nil)
