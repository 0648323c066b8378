// Package heapbench measures the heap a driver's held leases keep alive,
// for the drivers' BenchmarkHeapPerLease.
package heapbench

import (
	"fmt"
	"os"
	"path"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"
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
