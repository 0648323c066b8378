package sqlitelock

import (
	"path/filepath"
	"testing"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/heapbench"
)

// BenchmarkHeapPerLease holds b.N locks (at least 1000; the goal is
// measured at -benchtime=10000x) of distinct names through a dlock Client,
// each taken with a context.WithTimeout of its own cancelled once Lock
// returns, as the peer comparison takes them, and reports the heap they
// keep alive per held lock (B/lease; the whole process, after a GC). With
// SQLITELOCK_HEAP_PROFILE set (and -memprofilerate=1) it writes a heap
// profile of what stays alive.
func BenchmarkHeapPerLease(b *testing.B) {
	d, err := Open(filepath.Join(b.TempDir(), "locks.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	c := dlock.New(d, nil)
	defer c.Close()
	heapbench.PerLease(b, "SQLITELOCK_HEAP_PROFILE", heapbench.ClientLocks(b, c, nil, true))
}
