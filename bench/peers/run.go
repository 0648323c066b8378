package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/dlock/dlock/locktest"
)

// config bounds each scenario.
type config struct {
	uncontended time.Duration // interleaved Lock+Unlock rounds, per backend
	hotRounds   int           // rounds of the hot-lock scenario
	hotSlice    time.Duration // each contender's time per hot-lock round
	goroutines  int           // hot-lock contenders
	wake        time.Duration // interleaved wake-up rounds, per backend
	held        []int         // levels of the many-held scenario (ascending)
	heldProbe   time.Duration // Lock+Unlock sampling per level, per backend
	opTimeout   time.Duration // bound on one call, so that nothing hangs
	runID       string        // prefix of every lock name of this run
	progress    func(format string, args ...any)
}

// row is what one contender measured.
type row struct {
	name string
	kind kind
	errs []string

	unc locktest.Stats

	hotOps      int
	hotElapsed  time.Duration
	hotRetakes  int
	handoffs    []time.Duration
	handoff     locktest.Stats
	wake        locktest.Stats
	wakeSamples []time.Duration

	held          []locktest.HeldLevel
	heldDone      bool // reached the last level
	acquirePer    time.Duration
	bytesPerLease float64
}

func (r *row) fail(scenario string, err error) {
	r.errs = append(r.errs, fmt.Sprintf("%s: %v", scenario, err))
}

func (r *row) opsPerSec() float64 {
	if r.hotElapsed <= 0 {
		return 0
	}
	return float64(r.hotOps) / r.hotElapsed.Seconds()
}

func (r *row) retakeShare() float64 {
	if r.hotOps < 2 {
		return 0
	}
	return float64(r.hotRetakes) / float64(r.hotOps-1)
}

// result is one backend's comparison.
type result struct {
	backend string
	rows    []*row
}

func (cfg *config) name(scenario string, i, round int) string {
	return fmt.Sprintf("%s-%s-%d-%d", cfg.runID, scenario, i, round)
}

// bounded calls f with a context bounded by cfg.opTimeout.
func (cfg *config) bounded(ctx context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.opTimeout)
	defer cancel()
	return f(ctx)
}

// runBackend runs every scenario on b.
func runBackend(ctx context.Context, cfg *config, b backend) *result {
	res := &result{backend: b.name}
	for _, c := range b.contenders {
		res.rows = append(res.rows, &row{name: c.name, kind: c.kind})
	}
	cfg.progress("%s: uncontended Lock+Unlock", b.name)
	uncontended(ctx, cfg, b, res)
	cfg.progress("%s: hot lock, %d goroutines", b.name, cfg.goroutines)
	hotLock(ctx, cfg, b, res)
	cfg.progress("%s: wake-up of one blocked waiter", b.name)
	wake(ctx, cfg, b, res)
	cfg.progress("%s: cost with many leases held", b.name)
	manyHeld(ctx, cfg, b, res)
	return res
}

// openAll opens one client per contender (nil where it failed, with the
// error recorded).
func openAll(ctx context.Context, cfg *config, b backend, res *result, scenario string, want func(*client) bool) []*client {
	cls := make([]*client, len(b.contenders))
	for i, c := range b.contenders {
		var cl *client
		err := cfg.bounded(ctx, func(ctx context.Context) (err error) {
			cl, err = c.open(ctx)
			return err
		})
		if err != nil {
			res.rows[i].fail(scenario, err)
			continue
		}
		if !want(cl) {
			cl.close()
			continue
		}
		cls[i] = cl
	}
	return cls
}

func closeAll(cls []*client) {
	for _, c := range cls {
		if c != nil {
			c.close()
		}
	}
}

// guarded turns the ops of cls into Interleave ops that record their first
// error in the row and do nothing after it (so one failing contender does
// not stop the others). Contenders without a client get a no-op.
func guarded(cfg *config, res *result, scenario string, ops []func(ctx context.Context) error) []func(ctx context.Context) error {
	out := make([]func(ctx context.Context) error, len(ops))
	for i, op := range ops {
		failed := op == nil
		out[i] = func(ctx context.Context) error {
			if failed {
				return nil
			}
			if err := cfg.bounded(ctx, op); err != nil {
				failed = true
				res.rows[i].fail(scenario, err)
			}
			return nil
		}
	}
	return out
}

// subset is the rows at the indices idx, in that order.
func subset[T any](rows []T, idx []int) []T {
	out := make([]T, len(idx))
	for k, i := range idx {
		out[k] = rows[i]
	}
	return out
}

func uncontended(ctx context.Context, cfg *config, b backend, res *result) {
	cls := openAll(ctx, cfg, b, res, "uncontended", func(*client) bool { return true })
	defer closeAll(cls)
	ops := make([]func(ctx context.Context) error, len(cls))
	for i, cl := range cls {
		if cl != nil {
			name := cfg.name("unc", i, 0)
			ops[i] = func(ctx context.Context) error { return cl.once(ctx, name) }
		}
	}
	g := guarded(cfg, res, "uncontended", ops)
	// Warm every path (scripts loaded, statements prepared, tables made).
	_, _ = locktest.Interleave(ctx, locktest.Budget{Max: 20}, g)
	ds, _ := locktest.Interleave(ctx, locktest.Budget{Duration: cfg.uncontended}, g)
	for i, d := range ds {
		if len(res.rows[i].errs) == 0 {
			res.rows[i].unc = locktest.Summarize(d)
		}
	}
}

func hotLock(ctx context.Context, cfg *config, b backend, res *result) {
	n := len(b.contenders)
	for round := 0; round < cfg.hotRounds; round++ {
		for k := range n {
			i := (k + round) % n
			c, r := b.contenders[i], res.rows[i]
			if c.kind == kindFloor || len(r.errs) > 0 {
				continue
			}
			// One client per goroutine: session locks (pg_advisory_lock,
			// GET_LOCK) are re-entrant within a session.
			var cls []*client
			var err error
			for range cfg.goroutines {
				var cl *client
				if err = cfg.bounded(ctx, func(ctx context.Context) (err error) {
					cl, err = c.open(ctx)
					return err
				}); err != nil {
					break
				}
				cls = append(cls, cl)
			}
			if err == nil {
				name := cfg.name("hot", i, round)
				lockers := make([]locktest.LockFunc, len(cls))
				for g, cl := range cls {
					lockers[g] = cl.lock(name)
				}
				var hr locktest.HotResult
				hr, err = locktest.HotLock(ctx, locktest.Budget{Duration: cfg.hotSlice}, lockers)
				r.hotOps += hr.Ops
				r.hotElapsed += hr.Elapsed
				r.hotRetakes += hr.Retakes
				r.handoffs = append(r.handoffs, hr.Handoffs...)
			}
			closeAll(cls)
			if err != nil {
				r.fail("hot lock", err)
			}
		}
	}
	for _, r := range res.rows {
		r.handoff = locktest.Summarize(r.handoffs)
	}
}

func wake(ctx context.Context, cfg *config, b backend, res *result) {
	hasLock := func(cl *client) bool { return cl.lock != nil }
	holders := openAll(ctx, cfg, b, res, "wake", hasLock)
	defer closeAll(holders)
	waiters := openAll(ctx, cfg, b, res, "wake", hasLock)
	defer closeAll(waiters)
	ops := make([]func(ctx context.Context) error, len(holders))
	for i := range holders {
		h, w, r := holders[i], waiters[i], res.rows[i]
		if h == nil || w == nil {
			continue
		}
		name := cfg.name("wake", i, 0)
		ops[i] = func(ctx context.Context) error {
			ds, err := locktest.Wake(ctx, locktest.Budget{Max: 1}, locktest.WakeSettle, h.lock(name), w.lock(name))
			r.wakeSamples = append(r.wakeSamples, ds...)
			return err
		}
	}
	_, _ = locktest.Interleave(ctx, locktest.Budget{Duration: cfg.wake}, guarded(cfg, res, "wake", ops))
	for _, r := range res.rows {
		r.wake = locktest.Summarize(r.wakeSamples)
	}
}

// manyHeld grows the number of locks each contender's client holds level
// by level, timing the taking and the heap it adds, and at each level times
// one Lock+Unlock of an unrelated name on every client. The clients take
// turns in blocks (locktest.InterleaveBlocks, about four rounds per level),
// not op by op: a peer whose op grows to milliseconds with what it holds (a
// PostgreSQL session holding 10,000 advisory locks walks them all at every
// commit) slows the server for the next few operations of whichever client
// comes after it. Interleaved op by op, even with a priming run, that
// charged PostgreSQL lease mode's Lock+Unlock 1.3-1.9x for the peer's 10,000
// advisory locks (and once 6.6x), while alone on the same server, with the
// peer's locks still held, it did not move.
func manyHeld(ctx context.Context, cfg *config, b backend, res *result) {
	cls := openAll(ctx, cfg, b, res, "many held", func(cl *client) bool { return cl.lock != nil })
	// Closing a client frees what it holds (dlock releases, sessions and
	// connections end); the peers' Redis keys are left to expire.
	defer closeAll(cls)
	releases := make([][]func(context.Context) error, len(cls))
	acquire := make([]time.Duration, len(cls))
	heap := make([]int64, len(cls))
	for _, level := range cfg.held {
		for i, cl := range cls {
			if cl == nil {
				continue
			}
			r := res.rows[i]
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			t0 := time.Now()
			for j := len(releases[i]); j < level; j++ {
				var rel func(context.Context) error
				err := cfg.bounded(ctx, func(ctx context.Context) (err error) {
					// Names differ per contender: some share the server's
					// lock namespace (GET_LOCK, advisory locks).
					rel, err = cl.lock(cfg.name("held", i, j))(ctx)
					return err
				})
				if err != nil {
					r.fail("many held", fmt.Errorf("lock %d: %w", j, err))
					cls[i] = nil
					cl.close()
					break
				}
				releases[i] = append(releases[i], rel)
			}
			if cls[i] == nil {
				continue
			}
			acquire[i] += time.Since(t0)
			runtime.GC()
			runtime.ReadMemStats(&after)
			heap[i] += int64(after.HeapAlloc) - int64(before.HeapAlloc)
		}
		// Only the clients still holding take part: a block of a no-op
		// would spin for its whole length.
		var ops []func(ctx context.Context) error
		var rows []int
		for i, cl := range cls {
			if cl != nil {
				name := cfg.name("probe", i, 0)
				ops = append(ops, func(ctx context.Context) error { return cl.once(ctx, name) })
				rows = append(rows, i)
			}
		}
		if len(ops) == 0 {
			break
		}
		block := cfg.heldProbe / time.Duration(4*len(ops))
		g := guarded(cfg, &result{rows: subset(res.rows, rows)}, "many held", ops)
		ds, _ := locktest.InterleaveBlocks(ctx, locktest.Budget{Duration: cfg.heldProbe}, block, g)
		for k, i := range rows {
			if len(ds[k]) > 0 {
				res.rows[i].held = append(res.rows[i].held, locktest.HeldLevel{Held: level, Op: locktest.Summarize(ds[k])})
			}
		}
	}
	for i, cl := range cls {
		if cl == nil {
			continue
		}
		r := res.rows[i]
		r.heldDone = true
		if n := len(releases[i]); n > 0 {
			r.acquirePer = acquire[i] / time.Duration(n)
			r.bytesPerLease = float64(heap[i]) / float64(n)
		}
	}
}
