package pglock

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
	b.Run("Advisory", func(b *testing.B) { wakeFair(b, ModeAdvisory) })
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
