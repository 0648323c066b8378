package sqlitelock

import (
	"context"
	"testing"
	"time"
)

// BenchmarkDriverAcquireRelease measures one TryAcquire plus Release at the
// driver level, beside the floor of two bare write transactions on the same
// connection (what the locktest benchmarks compare the whole stack to).
func BenchmarkDriverAcquireRelease(b *testing.B) {
	path := b.TempDir() + "/locks.db"
	d, err := Open(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	b.Run("driver", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			g, err := d.TryAcquire(ctx, req("bench", "alice", time.Minute, 0))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := d.Release(ctx, lease("bench", "alice", g.Token, time.Minute, 0)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("floor", func(b *testing.B) {
		op, cleanup, err := acquireReleaseFloor(ctx, d.db)
		if err != nil {
			b.Fatal(err)
		}
		defer cleanup()
		for i := 0; i < b.N; i++ {
			if err := op(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
