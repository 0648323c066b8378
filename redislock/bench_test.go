package redislock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/testserver"
)

// BenchmarkDriver measures the driver alone (no dlock client on top)
// against the raw floor, interleaved on the same server.
func BenchmarkDriver(b *testing.B) {
	srv := testserver.Redis(b, nil)
	ctx := context.Background()
	d := openURLDriver(b, srv.URL())
	opt, _ := redis.ParseURL(srv.URL())
	opt.PoolSize = 1
	raw := redis.NewClient(opt)
	defer raw.Close()

	b.Run("AcquireRelease", func(b *testing.B) {
		req := driver.AcquireRequest{Name: "bench", Owner: "o1", TTL: 30 * time.Second}
		var lockD, floorD []time.Duration
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := rawAcquireRelease(ctx, raw, "floor"); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			g, err := d.TryAcquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := d.Release(ctx, driver.Lease{Name: req.Name, Owner: req.Owner, Token: g.Token, Handle: g.Handle}); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			floorD = append(floorD, t1.Sub(t0))
			lockD = append(lockD, t2.Sub(t1))
		}
		b.ReportMetric(float64(p50(lockD))/float64(p50(floorD)), "x-floor")
		b.ReportMetric(float64(p50(floorD).Microseconds()), "floor-µs")
	})

	b.Run("Handoff", func(b *testing.B) {
		// One holder, one waiter in another driver: from the release call
		// to the waiter's grant, over a PING round trip.
		d2 := openURLDriver(b, srv.URL())
		var hand, rtt []time.Duration
		for i := 0; i < b.N; i++ {
			name := fmt.Sprintf("handoff-%d", i)
			g, err := d.TryAcquire(ctx, driver.AcquireRequest{Name: name, Owner: "a", TTL: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			sub, err := d2.Subscribe(ctx, name)
			if err != nil {
				b.Fatal(err)
			}
			req := driver.AcquireRequest{Name: name, Owner: "b", TTL: 30 * time.Second}
			if _, err := d2.TryAcquire(ctx, req); !errors.Is(err, driver.ErrLocked) {
				b.Fatalf("want locked, got %v", err)
			}
			<-sub.C() // the subscription's confirmation
			released := make(chan time.Time, 1)
			go func() {
				t := time.Now()
				_, _ = d.Release(ctx, driver.Lease{Name: name, Owner: "a", Token: g.Token, Handle: g.Handle})
				released <- t
			}()
			<-sub.C()
			g2, err := d2.TryAcquire(ctx, req)
			if err != nil {
				b.Fatalf("after wake-up: %v", err)
			}
			hand = append(hand, time.Since(<-released))
			_, _ = d2.Release(ctx, driver.Lease{Name: name, Owner: "b", Token: g2.Token, Handle: g2.Handle})
			_ = sub.Close()
			t0 := time.Now()
			_ = raw.Ping(ctx).Err()
			rtt = append(rtt, time.Since(t0))
		}
		b.ReportMetric(float64(p50(hand).Microseconds()), "handoff-µs")
		b.ReportMetric(float64(p50(hand))/float64(p50(rtt)), "handoff/rtt")
	})
}

func p50(ds []time.Duration) time.Duration {
	c := append([]time.Duration(nil), ds...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c[len(c)/2]
}
