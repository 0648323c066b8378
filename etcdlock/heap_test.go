package etcdlock

import (
	"context"
	"fmt"
	"os"
	"path"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/driver"
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
		n := max(b.N, 1000)
		prefix := fmt.Sprintf("bench-heap-%d", time.Now().UnixNano())
		rels := make([]func(), 0, n)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		b.ResetTimer()
		for i := range n {
			rels = append(rels, take(fmt.Sprintf("%s-held-%d", prefix, i)))
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		// rels and its closures are the benchmark's, not the lock's:
		// counted as the peers' harness counts them.
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "B/lease")
		if f := os.Getenv("ETCDLOCK_HEAP_PROFILE"); f != "" {
			w, err := os.Create(f + "." + path.Base(b.Name()))
			if err != nil {
				b.Fatal(err)
			}
			_ = pprof.WriteHeapProfile(w)
			w.Close()
		}
		for _, rel := range rels {
			rel()
		}
	}
	b.Run("client", func(b *testing.B) {
		c := dlock.New(newTestDriver(b, newClient(b, shared.Endpoints()), nil), &dlock.Options{TTL: 30 * time.Second})
		defer c.Close()
		run(b, func(name string) func() {
			l, err := c.NewMutex(name, nil).Lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			return func() {
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("client-timeout", func(b *testing.B) {
		// Each Lock with a context of its own, cancelled once Lock returns,
		// as the peer comparison (bench/peers) takes them.
		c := dlock.New(newTestDriver(b, newClient(b, shared.Endpoints()), nil), &dlock.Options{TTL: 30 * time.Second})
		defer c.Close()
		run(b, func(name string) func() {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			l, err := c.NewMutex(name, nil).Lock(lctx)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			return func() {
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
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
