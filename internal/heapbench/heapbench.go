// Package heapbench measures the heap a driver's held leases keep alive,
// for the drivers' BenchmarkHeapPerLease.
package heapbench

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
)

// PerLease holds max(b.N, 1000) locks of distinct names, each taken by
// take (which returns its release), and reports the heap they keep alive
// per held lock as B/lease: the whole process's HeapAlloc after a GC, so
// the release closures count too, as the peers' harness counts them. When
// the environment variable profileEnv names a file, a heap profile is
// written to that name plus "." and the benchmark's base name (run with
// -memprofilerate=1 to see what stays alive). Then every lock is released.
func PerLease(b *testing.B, profileEnv string, take func(name string) (release func())) {
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
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n), "B/lease")
	if f := os.Getenv(profileEnv); f != "" {
		w, err := os.Create(f + "." + path.Base(b.Name()))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(w); err != nil {
			b.Error(err)
		}
		_ = w.Close()
	}
	for _, rel := range rels {
		rel()
	}
}

// ClientLocks returns a take for PerLease that locks name with c (with
// options o) and whose release unlocks it. With perCallTimeout, each Lock
// gets a context.WithTimeout of its own, cancelled once Lock returns, as the
// peer comparison (bench/peers) takes them: a Lease keeps that context for
// Lease.Context's values.
func ClientLocks(b *testing.B, c *dlock.Client, o *dlock.MutexOptions, perCallTimeout bool) func(name string) (release func()) {
	ctx := context.Background()
	return func(name string) func() {
		lctx, cancel := ctx, context.CancelFunc(func() {})
		if perCallTimeout {
			lctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		}
		l, err := c.NewMutex(name, o).Lock(lctx)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		return func() {
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
}
