package zklock

import (
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/heapbench"
)

// BenchmarkHeapPerLease holds b.N locks (at least 1000; the goal is
// measured at -benchtime=10000x) of distinct names through a dlock Client,
// each taken with a context.WithTimeout of its own cancelled once Lock
// returns, as the peer comparison takes them, and reports the heap they
// keep alive per held lock (B/lease; the whole process, after a GC). With
// ZKLOCK_HEAP_PROFILE set (and -memprofilerate=1) it writes a heap profile
// of what stays alive.
func BenchmarkHeapPerLease(b *testing.B) {
	c := dlock.New(newTestDriver(b, shared.Endpoints(), nil), nil)
	defer c.Close()
	heapbench.PerLease(b, "ZKLOCK_HEAP_PROFILE", heapbench.ClientLocks(b, c, nil, true))
}
