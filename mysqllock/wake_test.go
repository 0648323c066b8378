package mysqllock

import (
	"context"
	"testing"

	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// BenchmarkWakeFair reports wake-up latency, the re-take share under 8
// contenders and the longest wait with 9 (see sqltest.WakeFair). Run with
// -benchtime=50x or so: each run takes some 6s whatever b.N.
func BenchmarkWakeFair(b *testing.B) {
	b.Run("Lease", func(b *testing.B) { wakeFair(b, ModeLease) })
	b.Run("GetLock", func(b *testing.B) { wakeFair(b, ModeGetLock) })
}

func wakeFair(b *testing.B, mode Mode) {
	hn, err := newHarnessFor(mode)(context.Background(), b)
	if err != nil {
		b.Fatal(err)
	}
	h := hn.(*harness)
	defer h.Close()
	sqltest.WakeFair(b, h.NewDriver)
}

// TestWakesOnRelease: in every mode a release wakes a waiter on another
// driver long before its next poll.
func TestWakesOnRelease(t *testing.T) {
	for _, mode := range []Mode{ModeLease, ModeGetLock, ModeRowLock} {
		t.Run(string(mode), func(t *testing.T) {
			sqltest.WakesOnRelease(t, newTestHarness(t, mode).NewDriver)
		})
	}
}
