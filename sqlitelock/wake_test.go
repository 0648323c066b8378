package sqlitelock

import (
	"context"
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// BenchmarkWakeFair reports wake-up latency, the re-take share under 8
// contenders and the longest wait with 9 (see sqltest.WakeFair), each driver
// opening the file anew as another process would. Run with -benchtime=50x
// or so: each run takes some 6s whatever b.N.
func BenchmarkWakeFair(b *testing.B) {
	hn, err := newHarness(context.Background(), b)
	if err != nil {
		b.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	sqltest.WakeFair(b, h.NewDriver)
}

// TestWakesOnRelease: a release wakes a waiter in another driver (another
// process, as far as the file is concerned) through the companion file,
// long before its next poll.
func TestWakesOnRelease(t *testing.T) {
	hn, err := newHarness(context.Background(), t)
	if err != nil {
		t.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	sqltest.WakesOnRelease(t, h.NewDriver)
}
