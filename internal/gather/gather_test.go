package gather

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestQuorum: with want values good, Quorum stops waiting for a value that
// never comes after as long again as the wait took; short of want, it
// waits for every value; a bad value does not count towards want.
func TestQuorum(t *testing.T) {
	good := func(v int) bool { return v > 0 }
	t.Run("silent node", func(t *testing.T) {
		results := make(chan int, 3)
		results <- 1
		results <- 2 // the third never comes
		start := time.Now()
		got := Quorum(results, 3, 2, good)
		if len(got) != 2 || got[0] != 1 || got[1] != 2 {
			t.Fatalf("Quorum = %v, want [1 2]", got)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Quorum waited %v for a value that never came", took)
		}
	})
	t.Run("short of want", func(t *testing.T) {
		results := make(chan int, 3)
		results <- 1
		results <- -1
		late := time.AfterFunc(50*time.Millisecond, func() { results <- 3 })
		defer late.Stop()
		got := Quorum(results, 3, 2, good)
		if len(got) != 3 {
			t.Fatalf("Quorum = %v, want all three values (one was bad, so want was not met before the third)", got)
		}
	})
	t.Run("all come", func(t *testing.T) {
		results := make(chan int, 3)
		for i := 1; i <= 3; i++ {
			results <- i
		}
		if got := Quorum(results, 3, 2, good); len(got) != 3 {
			t.Fatalf("Quorum = %v, want all three", got)
		}
	})
}
