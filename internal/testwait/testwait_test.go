package testwait

import (
	"testing"
	"time"
)

type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(string, ...any) {
	r.failed = true
	panic(r) // stop the loop as Fatalf's Goexit would
}

func TestUntil(t *testing.T) {
	n := 0
	Until(t, time.Second, "third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	r := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		Until(r, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if !r.failed {
		t.Fatal("Until did not fail on a condition that never held")
	}
}
