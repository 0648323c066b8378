//go:build stress

package mysqllock

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/internal/sqlcommon/sqltest"
)

// TestStressHotGetLock is the bench/peers hot-lock scenario as a test,
// built only with the stress tag (go test -tags stress), so that a normal
// run has no opt-in test to skip:
// 8 clients, one goroutine each, a tight Lock/Unlock loop on one name in
// getlock mode, for DLOCK_STRESS (a duration, default 10s); with
// DLOCK_STRESS_CANCEL set too, each Lock gets a random deadline of up to
// 3ms, so that many end while a statement is in flight.
func TestStressHotGetLock(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("DLOCK_STRESS"))
	if err != nil {
		dur = 10 * time.Second
	}
	cancelEarly := os.Getenv("DLOCK_STRESS_CANCEL") != ""
	ctx := context.Background()
	u := sqltest.ModeURL(serverURL(t), string(ModeGetLock), "dlock_stress")
	name := sqltest.RandomName("hot")
	var ops, holders atomic.Int64
	var mu sync.Mutex
	var fails []error
	stop := time.Now().Add(dur)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		c, err := dlock.Open(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		m := c.NewMutex(name, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				at := stop
				if cancelEarly {
					// A short deadline that often ends mid-Lock, as the
					// end of a benchmark's time slice does once.
					if t := time.Now().Add(time.Duration(rand.Int64N(int64(3 * time.Millisecond)))); t.Before(stop) {
						at = t
					}
				}
				lctx, cancel := context.WithDeadline(ctx, at)
				l, err := m.Lock(lctx)
				// A Lock that fails at its deadline is no finding (a dial
				// can time out a hair before the context reports it).
				ended := lctx.Err() != nil || time.Until(at) < 10*time.Millisecond
				cancel()
				if err != nil {
					if !ended {
						mu.Lock()
						fails = append(fails, err)
						mu.Unlock()
					}
					continue
				}
				if n := holders.Add(1); n != 1 {
					mu.Lock()
					fails = append(fails, errors.New("two holders"))
					mu.Unlock()
				}
				lost := l.Err()
				holders.Add(-1)
				if err := l.Unlock(ctx); err != nil {
					mu.Lock()
					fails = append(fails, err)
					t.Logf("goroutine %d: unlock: %v (Err before unlock: %v; Err now: %v)", g, err, lost, l.Err())
					mu.Unlock()
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d Lock/Unlock in %v", ops.Load(), dur)
	for _, f := range fails {
		t.Errorf("failure: %v", f)
	}
}
