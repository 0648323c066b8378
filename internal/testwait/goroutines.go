package testwait

import "runtime/metrics"

// GoroutinesCreated reads the runtime's count of goroutines started so far
// (0 when the runtime does not report it), for tests that check an
// operation starts none.
func GoroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
