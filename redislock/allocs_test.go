package redislock

import (
	"fmt"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
)

// TestAcquireAllocs bounds the allocations of an uncontended grant by the
// driver, back to back (on the lane), go-redis's share included: Acquire
// (a waiting caller's, queued if refused) and TryAcquire of distinct names.
// Of TryAcquire's 18: the lock's Ref (2: its string and the handle), the
// fencing counter and release channel (1, built once per call), the
// script's command (9: its one slice, the boxes of the 4 keys, owner, TTL
// and channel, the Cmd), the rest go-redis's and the book of grants';
// Acquire boxes the queue wait too. Before: the keys were built twice in
// Acquire (once more per attempt), and go-redis's EvalSha copied the keys
// and arguments into slices of its own (4 allocations).
func TestAcquireAllocs(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	const runs = 200
	for _, tc := range []struct {
		name    string
		acquire func(req driver.AcquireRequest) (driver.Grant, error)
		max     float64
	}{
		{"Acquire", func(req driver.AcquireRequest) (driver.Grant, error) { return f.d.Acquire(ctx, req) }, 19},
		{"TryAcquire", func(req driver.AcquireRequest) (driver.Grant, error) { return f.d.TryAcquire(ctx, req) }, 18},
	} {
		reqs := make([]driver.AcquireRequest, runs+1) // AllocsPerRun runs f once more
		for i := range reqs {
			reqs[i] = driver.AcquireRequest{Name: fmt.Sprintf("allocs-%s-%d", tc.name, i), Owner: "owner-1", TTL: 10 * time.Second}
		}
		if _, err := tc.acquire(driver.AcquireRequest{Name: "allocs-warm-" + tc.name, Owner: "owner-1", TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
		i := 0
		var err error
		n := testing.AllocsPerRun(runs, func() {
			if _, e := tc.acquire(reqs[i]); e != nil && err == nil {
				err = e
			}
			i++
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %.1f allocations per grant", tc.name, n)
		if n > tc.max+0.2 { // the book's map grows now and then
			t.Errorf("%s: an uncontended grant takes %.1f allocations, want at most %v", tc.name, n, tc.max)
		}
	}
}
