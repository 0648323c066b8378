package redistest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	dlock "github.com/dlock/dlock"
)

// BenchFairness runs two contention scenarios on one lock and reports how
// evenly the lock is shared, as metrics rather than asserts:
//
//   - Retake: 8 goroutines over 4 clients, each holding the lock for a
//     moment and asking again at once; metric retake-% (grants that went to
//     the goroutine that held the lock just before; < 50 is the goal,
//     100/8 is perfectly fair).
//   - Hold100ms: 3 clients (processes) × 3 goroutines, each holding ≈100ms,
//     for b.N rounds of 9 grants; metrics retake-%, max-wait-ms (longest
//     Lock call) and p50-wait-ms.
func BenchFairness(b *testing.B, open NewDriver) {
	ctx := context.Background()
	clients := func(n int) []*dlock.Client {
		cs := make([]*dlock.Client, n)
		for i := range cs {
			d, err := open(ctx)
			if err != nil {
				b.Fatal(err)
			}
			cs[i] = dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
			c := cs[i]
			b.Cleanup(func() { _ = c.Close() })
		}
		return cs
	}
	b.Run("Retake", func(b *testing.B) {
		cs := clients(4)
		name := fmt.Sprintf("fair-retake-%d", time.Now().UnixNano())
		grants, _ := contend(b, cs, 8, name, 200*b.N, 0)
		b.ReportMetric(retakePercent(grants), "retake-%")
	})
	b.Run("Hold100ms", func(b *testing.B) {
		cs := clients(3)
		name := fmt.Sprintf("fair-hold-%d", time.Now().UnixNano())
		grants, waits := contend(b, cs, 9, name, 9*b.N, 100*time.Millisecond)
		b.ReportMetric(retakePercent(grants), "retake-%")
		sortDurations(waits)
		b.ReportMetric(float64(waits[len(waits)-1].Milliseconds()), "max-wait-ms")
		b.ReportMetric(float64(waits[len(waits)/2].Milliseconds()), "p50-wait-ms")
	})
}

// retakePercent is the share of grants that went to the worker that held
// the lock just before.
func retakePercent(grants []grant) float64 {
	retakes := 0
	for i := 1; i < len(grants); i++ {
		if grants[i].worker == grants[i-1].worker {
			retakes++
		}
	}
	return 100 * float64(retakes) / float64(max(len(grants)-1, 1))
}

type grant struct{ worker int }

// contend runs workers goroutines over cs taking name total times between
// them, each holding it for hold, and returns the grants in order and every
// Lock call's duration.
func contend(b *testing.B, cs []*dlock.Client, workers int, name string, total int, hold time.Duration) ([]grant, []time.Duration) {
	var (
		mu     sync.Mutex
		grants []grant
		waits  []time.Duration
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int, c *dlock.Client) {
			defer wg.Done()
			m := c.NewMutex(name, nil)
			for {
				t0 := time.Now()
				l, err := m.Lock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						b.Errorf("worker %d: %v", w, err)
						cancel()
					}
					return
				}
				mu.Lock()
				done := len(grants) >= total
				if !done {
					grants = append(grants, grant{worker: w})
					waits = append(waits, time.Since(t0))
				}
				mu.Unlock()
				if hold > 0 && !done {
					time.Sleep(hold) // the work done under the lock
				}
				_ = l.Unlock(ctx)
				if done {
					cancel()
					return
				}
			}
		}(w, cs[w%len(cs)])
	}
	wg.Wait()
	return grants, waits
}

func sortDurations(ds []time.Duration) {
	for i := 1; i < len(ds); i++ {
		for j := i; j > 0 && ds[j] < ds[j-1]; j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
}
