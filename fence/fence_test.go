package fence_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/dlock/dlock/fence"
)

func TestCheckerRefusesStaleTokens(t *testing.T) {
	var c fence.Checker
	for _, tok := range []uint64{1, 1, 2, 5} {
		if err := c.Check("r", tok); err != nil {
			t.Fatalf("Check(%d) = %v, want accepted", tok, err)
		}
	}
	err := c.Check("r", 4)
	var se *fence.StaleError
	if !errors.Is(err, fence.ErrStale) || !errors.As(err, &se) || se.Highest != 5 || se.Token != 4 {
		t.Fatalf("Check(4) after 5 = %v, want StaleError{Token 4, Highest 5}", err)
	}
	if err := c.Check("other", 1); err != nil {
		t.Fatalf("resources are independent: %v", err)
	}
	if err := c.Check("r", 0); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("Check(0) = %v, want ErrStale", err)
	}
}

func TestCheckerConcurrent(t *testing.T) {
	var c fence.Checker
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := map[uint64]int{}
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := uint64(1); i <= 500; i++ {
				tok := i*8 + uint64(g)
				_ = c.Do("r", tok, func() error {
					mu.Lock()
					accepted[tok]++
					mu.Unlock()
					return nil
				})
			}
		}(g)
	}
	wg.Wait()
	if h := c.Highest("r"); h != 500*8+7 {
		t.Fatalf("Highest = %d, want %d", h, 500*8+7)
	}
	for tok, n := range accepted {
		if n != 1 {
			t.Fatalf("token %d written %d times", tok, n)
		}
	}
}

func TestDoSkipsWriteWhenStale(t *testing.T) {
	var c fence.Checker
	_ = c.Check("r", 10)
	called := false
	err := c.Do("r", 9, func() error { called = true; return nil })
	if called || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("Do with a stale token: called=%v err=%v", called, err)
	}
	want := errors.New("disk full")
	if err := c.Do("r", 11, func() error { return want }); err != want {
		t.Fatalf("Do returns write's error: got %v", err)
	}
}

// A resource server refuses a paused ex-holder's late write.
func Example() {
	var storage fence.Checker
	write := func(holder string, token uint64) {
		if err := storage.Check("orders/42", token); err != nil {
			fmt.Printf("%s: refused: %v\n", holder, err)
			return
		}
		fmt.Printf("%s: written with token %d\n", holder, token)
	}
	write("A", 33) // A holds the lock with token 33 ...
	write("B", 34) // ... A pauses, its lease expires, B takes the lock with 34
	write("A", 33) // A wakes up and tries to write
	// Output:
	// A: written with token 33
	// B: written with token 34
	// A: refused: fence: stale fencing token 33 for "orders/42" (highest accepted 34)
}
