package locktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The measurements below are the building blocks of RunBenchmarks, of the
// "dlock bench" command and of the peer comparison in bench/peers. They work
// on plain functions, so that any lock (dlock's, a peer library's, a raw
// floor) can be measured the same way in one run. None of them keeps state
// between calls; each is safe to call from one goroutine at a time.

// Stats summarises latency samples.
type Stats struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
}

// Summarize returns the count, median and 99th percentile of ds without
// changing ds (zero Stats for none).
func Summarize(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	c := slices.Clone(ds)
	slices.Sort(c)
	return Stats{N: len(c), P50: c[len(c)/2], P99: c[min(len(c)-1, len(c)*99/100)]}
}

// Budget bounds a measurement: it stops after Max samples (rounds,
// operations) or when Duration has passed, whichever comes first. A zero
// field does not bound; a Budget with neither set takes one sample.
type Budget struct {
	Duration time.Duration
	Max      int
}

func (b Budget) deadline(start time.Time) time.Time {
	if b.Duration <= 0 {
		return time.Time{}
	}
	return start.Add(b.Duration)
}

// more reports whether sample i (counted from 0) is still within b.
func (b Budget) more(i int, deadline time.Time) bool {
	if b.Max > 0 && i >= b.Max {
		return false
	}
	if !deadline.IsZero() {
		return i == 0 || time.Now().Before(deadline)
	}
	return b.Max > 0 || i == 0
}

// Interleave times ops in rounds: each round runs every op once, in an
// order shuffled anew each round (from a fixed seed, so the sequence is the
// same on every run), so that drift on a noisy machine hits all of them
// alike and no op always comes right after the same other one (see order).
// It returns the durations of each op, indexed like ops, and stops at the
// first error (wrapped with the op's index) or when b runs out.
func Interleave(ctx context.Context, b Budget, ops []func(ctx context.Context) error) ([][]time.Duration, error) {
	return interleave(ctx, b, 0, ops)
}

// InterleavePrimed is Interleave where every timed run of an op comes right
// after an untimed run of the same op. Use it when the ops' costs differ
// widely: after an op that keeps the machine waiting for milliseconds (a
// peer whose cost grows with what it holds, say), the next op pays for the
// idle time — parked threads, a CPU woken from sleep — and would be charged
// with a slowness that is not its own. The priming run absorbs that.
func InterleavePrimed(ctx context.Context, b Budget, ops []func(ctx context.Context) error) ([][]time.Duration, error) {
	return interleave(ctx, b, 1, ops)
}

// InterleaveBlocks times ops in blocks: each round gives every op, in an
// order shuffled as Interleave's, a block of back-to-back runs that lasts
// about block; the first run of a block is not timed, and every block times
// at least one run. It stops when b runs out (b.Max counts rounds) or at the
// first error, and returns the durations of each op, indexed like ops.
//
// Use it when one op leaves the machine or a shared server busy for several
// runs after it returns (a PostgreSQL session holding 10,000 advisory locks
// walks all of them at every commit; its backend's work and the scheduler's
// catch-up spill onto whatever runs next): Interleave would charge that to
// every run of the op after it, InterleavePrimed to every run past the first.
// In blocks it lands on the untimed first run and the few after it, not on
// the median. Blocks still alternate, so drift of a noisy machine hits all
// ops alike.
func InterleaveBlocks(ctx context.Context, b Budget, block time.Duration, ops []func(ctx context.Context) error) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(ops))
	deadline := b.deadline(time.Now())
	var o order
	for round := 0; b.more(round, deadline); round++ {
		for _, i := range o.next(len(ops)) {
			if err := ctx.Err(); err != nil {
				return out, err
			}
			if err := ops[i](ctx); err != nil {
				return out, fmt.Errorf("op %d: %w", i, err)
			}
			end := time.Now().Add(block)
			for first := true; first || time.Now().Before(end); first = false {
				if err := ctx.Err(); err != nil {
					return out, err
				}
				t0 := time.Now()
				if err := ops[i](ctx); err != nil {
					return out, fmt.Errorf("op %d: %w", i, err)
				}
				out[i] = append(out[i], time.Since(t0))
			}
		}
	}
	return out, nil
}

func interleave(ctx context.Context, b Budget, prime int, ops []func(ctx context.Context) error) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(ops))
	deadline := b.deadline(time.Now())
	var o order
	for round := 0; b.more(round, deadline); round++ {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		for _, i := range o.next(len(ops)) {
			for range prime {
				if err := ops[i](ctx); err != nil {
					return out, fmt.Errorf("op %d: %w", i, err)
				}
			}
			t0 := time.Now()
			if err := ops[i](ctx); err != nil {
				return out, fmt.Errorf("op %d: %w", i, err)
			}
			out[i] = append(out[i], time.Since(t0))
		}
	}
	return out, nil
}

// order is the running order of Interleave's rounds: a new random
// permutation every round, from a fixed seed (the same sequence on every
// run). Rotating one order would keep every op right after the same other
// one, and an op whose work goes on after it returns (a PostgreSQL commit
// that wakes the WAL writer, a server still busy) would be charged to that
// one op on every round; shuffled, every op follows each other one about
// equally often, and drift of a noisy machine still hits all of them alike.
type order struct {
	rng  *rand.Rand
	perm []int
}

func (o *order) next(n int) []int {
	if o.rng == nil {
		o.rng = rand.New(rand.NewPCG(1, 2))
		o.perm = make([]int, n)
		for i := range o.perm {
			o.perm[i] = i
		}
	}
	o.rng.Shuffle(n, func(i, j int) { o.perm[i], o.perm[j] = o.perm[j], o.perm[i] })
	return o.perm
}

// LockFunc takes one lock, waiting as long as ctx allows, and returns the
// function that frees it.
type LockFunc func(ctx context.Context) (unlock func(ctx context.Context) error, err error)

// HotResult is what HotLock measured.
type HotResult struct {
	// Ops is how many times the lock was taken, in Elapsed.
	Ops     int
	Elapsed time.Duration
	// Handoffs are the times from one holder's release (the midpoint of its
	// unlock call, the best estimate of when the server freed the lock) to
	// the next holder's grant, in grant order.
	Handoffs []time.Duration
	// Retakes is how many grants went to the goroutine that held the lock
	// just before (out of Ops-1 hand-offs).
	Retakes int
}

// OpsPerSec is the throughput.
func (r HotResult) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// RetakeShare is the share of hand-offs in which the previous holder took
// the lock again (0 to 1).
func (r HotResult) RetakeShare() float64 {
	if r.Ops < 2 {
		return 0
	}
	return float64(r.Retakes) / float64(r.Ops-1)
}

// HotLock runs one goroutine per entry of lockers, each taking and at once
// freeing the same lock in a loop, until b runs out (Max counts grants).
// lockers[g] is goroutine g's way of taking the lock; give goroutines
// separate clients (connections, sessions) where the lock is per client.
func HotLock(ctx context.Context, b Budget, lockers []LockFunc) (HotResult, error) {
	type grant struct {
		at, released time.Time
		g            int
	}
	var (
		mu          sync.Mutex
		grants      []grant
		wg          sync.WaitGroup
		errOnce     sync.Once
		firstErr    error
		taken       atomic.Int64
		ctxW, stopW = context.WithCancel(ctx)
	)
	defer stopW()
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		stopW()
	}
	if b.Duration <= 0 && b.Max <= 0 {
		b.Max = 1 // an unbounded Budget takes one sample
	}
	start := time.Now()
	deadline := b.deadline(start)
	if !deadline.IsZero() {
		var cancelT context.CancelFunc
		ctxW, cancelT = context.WithDeadline(ctxW, deadline)
		defer cancelT()
	}
	for g, lock := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				unlock, err := lock(ctxW)
				if err != nil {
					if !ranOut(ctxW) {
						fail(fmt.Errorf("goroutine %d: lock: %w", g, err))
					}
					return
				}
				// Holders are serialised by the lock, so the index of this
				// grant is its place in the sequence of holders.
				mu.Lock()
				i := len(grants)
				grants = append(grants, grant{at: time.Now(), g: g})
				mu.Unlock()
				n := taken.Add(1)
				t0 := time.Now()
				// The unlock must run even once the budget is spent.
				uerr := unlock(context.WithoutCancel(ctx))
				t1 := time.Now()
				mu.Lock()
				grants[i].released = t0.Add(t1.Sub(t0) / 2)
				mu.Unlock()
				if uerr != nil {
					fail(fmt.Errorf("goroutine %d: unlock: %w", g, uerr))
					return
				}
				if b.Max > 0 && n >= int64(b.Max) {
					stopW()
					return
				}
			}
		}()
	}
	wg.Wait()
	r := HotResult{Ops: len(grants), Elapsed: time.Since(start)}
	if firstErr != nil {
		return r, firstErr
	}
	if err := ctx.Err(); err != nil {
		return r, err
	}
	for i := 1; i < len(grants); i++ {
		if grants[i].g == grants[i-1].g {
			r.Retakes++
		}
		if !grants[i-1].released.IsZero() {
			r.Handoffs = append(r.Handoffs, max(grants[i].at.Sub(grants[i-1].released), 0))
		}
	}
	return r, nil
}

// fairGrace is how long past its end a Fair run lets a Lock that began
// before the end wait (tests shorten it).
var fairGrace = 10 * time.Second

// FairResult is what Fair measured.
type FairResult struct {
	// Seq is the goroutine of each grant, in grant order.
	Seq []int
	// Waits are the Lock waits that ended in a grant.
	Waits []time.Duration
	// MaxWait is the longest single Lock wait, a Lock still waiting when
	// the run ended included (with its wait until then).
	MaxWait time.Duration
}

// PerGoroutine returns how many grants each of n goroutines got.
func (r FairResult) PerGoroutine(n int) []int {
	out := make([]int, n)
	for _, g := range r.Seq {
		if g >= 0 && g < n {
			out[g]++
		}
	}
	return out
}

// RetakeShare is the share of grants (after the first) that went to the
// goroutine that held the lock just before (0 to 1).
func (r FairResult) RetakeShare() float64 {
	if len(r.Seq) < 2 {
		return 0
	}
	n := 0
	for i := 1; i < len(r.Seq); i++ {
		if r.Seq[i] == r.Seq[i-1] {
			n++
		}
	}
	return float64(n) / float64(len(r.Seq)-1)
}

// ranOut reports whether ctx has ended or its deadline has passed. A Lock
// can fail for its deadline while ctx.Err() is still nil: a client that
// sets its socket's deadline from ctx's (go-redis, pgx) sees the I/O
// timeout fire by the clock, and the context's own timer may run a little
// later on a loaded machine. Such a Lock ran out of time; it did not fail.
func ranOut(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// Fair runs one goroutine per entry of lockers, each looping: take the
// lock, hold it for hold, free it, for about d; a Lock that began before d
// ran out may wait up to fairGrace (10s) past it. It measures what a waiter sees when
// every contender keeps coming back: whether some wait far longer than
// others (give the goroutines several clients, as separate processes
// would be). Errors other than a Lock that ran out of time end the run.
func Fair(ctx context.Context, d, hold time.Duration, lockers []LockFunc) (FairResult, error) {
	stopAt := time.Now().Add(d)
	wctx, cancel := context.WithDeadline(ctx, stopAt.Add(fairGrace))
	defer cancel()
	var (
		mu       sync.Mutex
		r        FairResult
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	for g, lock := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stopAt) {
				t0 := time.Now()
				unlock, err := lock(wctx)
				waited := time.Since(t0)
				mu.Lock()
				r.MaxWait = max(r.MaxWait, waited)
				if err == nil {
					r.Seq = append(r.Seq, g)
					r.Waits = append(r.Waits, waited)
				}
				mu.Unlock()
				if err != nil {
					if !ranOut(wctx) {
						fail(fmt.Errorf("goroutine %d: lock: %w", g, err))
					}
					return
				}
				t := time.NewTimer(hold) // the holder's work, not a wait for a condition
				<-t.C
				if err := unlock(context.WithoutCancel(ctx)); err != nil {
					fail(fmt.Errorf("goroutine %d: unlock: %w", g, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return r, firstErr
	}
	return r, ctx.Err()
}

// WakeSettle is how long Wake lets the waiter block before the holder
// releases: long enough for any waiter to be parked in its wait (queued,
// subscribed, blocked in the server), short enough to keep runs short.
const WakeSettle = 20 * time.Millisecond

// Wake measures the wake-up of one blocked waiter: holder takes the lock,
// waiter starts waiting for it, and after settle the holder frees it; a
// sample is the time from the release (midpoint of the unlock call) to the
// waiter's grant. holder and waiter must be separate clients. Rounds repeat
// until b runs out.
func Wake(ctx context.Context, b Budget, settle time.Duration, holder, waiter LockFunc) ([]time.Duration, error) {
	var out []time.Duration
	deadline := b.deadline(time.Now())
	for round := 0; b.more(round, deadline); round++ {
		d, err := wakeOnce(ctx, settle, holder, waiter)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

func wakeOnce(ctx context.Context, settle time.Duration, holder, waiter LockFunc) (time.Duration, error) {
	unlock, err := holder(ctx)
	if err != nil {
		return 0, fmt.Errorf("holder: lock: %w", err)
	}
	type res struct {
		at     time.Time
		unlock func(context.Context) error
		err    error
	}
	got := make(chan res, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		u, err := waiter(wctx)
		got <- res{time.Now(), u, err}
	}()
	t := time.NewTimer(settle)
	select {
	case r := <-got:
		t.Stop()
		_ = unlock(ctx)
		if r.err == nil {
			_ = r.unlock(ctx)
			return 0, errors.New("waiter: granted while the holder held the lock")
		}
		return 0, fmt.Errorf("waiter: lock: %w", r.err)
	case <-t.C:
	}
	t0 := time.Now()
	if err := unlock(ctx); err != nil {
		cancel()
		<-got
		return 0, fmt.Errorf("holder: unlock: %w", err)
	}
	released := t0.Add(time.Since(t0) / 2)
	r := <-got
	if r.err != nil {
		return 0, fmt.Errorf("waiter: lock: %w", r.err)
	}
	if err := r.unlock(ctx); err != nil {
		return 0, fmt.Errorf("waiter: unlock: %w", err)
	}
	return max(r.at.Sub(released), 0), nil
}

// HoldFunc takes the i-th of many distinct locks and returns its release.
type HoldFunc func(ctx context.Context, i int) (release func(ctx context.Context) error, err error)

// ErrHold is wrapped by the error ManyHeld returns when hold fails (for
// example on a backend that pins a connection per held lock and has run out
// of them); the levels measured until then are in its result.
var ErrHold = errors.New("could not hold lock")

// HeldLevel is one point of ManyHeld.
type HeldLevel struct {
	// Held is how many other locks were held while op ran.
	Held int   `json:"held"`
	Op   Stats `json:"op"`
}

// HeldResult is what ManyHeld measured.
type HeldResult struct {
	Levels []HeldLevel
	// AcquirePerLease is the mean time hold took per lock, over all levels.
	AcquirePerLease time.Duration
	// BytesPerLease is the growth of the live heap per held lock, after a
	// garbage collection, at the last level.
	BytesPerLease float64
}

// Ratio is the p50 cost of op at the last level over its cost at the first
// (0 when either is unknown).
func (r HeldResult) Ratio() float64 {
	if len(r.Levels) < 2 || r.Levels[0].Op.P50 <= 0 {
		return 0
	}
	return float64(r.Levels[len(r.Levels)-1].Op.P50) / float64(r.Levels[0].Op.P50)
}

// ManyHeld measures how the cost of op (one Lock+Unlock of an unrelated
// name, on the same client) grows with the number of locks the client holds:
// at each level of levels (ascending, e.g. 0, 1000, 10000) it takes locks
// with hold until that many are held, then times op within perLevel. It also
// reports the heap per held lock. Every lock taken is released before it
// returns, also on error.
func ManyHeld(ctx context.Context, levels []int, perLevel Budget, op func(ctx context.Context) error, hold HoldFunc) (HeldResult, error) {
	var (
		r        HeldResult
		releases []func(context.Context) error
		acquire  time.Duration
		before   runtime.MemStats
	)
	defer func() {
		for _, rel := range releases {
			_ = rel(context.WithoutCancel(ctx))
		}
	}()
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, n := range levels {
		t0 := time.Now()
		for i := len(releases); i < n; i++ {
			rel, err := hold(ctx, i)
			if err != nil {
				return r, fmt.Errorf("%w %d: %w", ErrHold, i, err)
			}
			releases = append(releases, rel)
		}
		acquire += time.Since(t0)
		ds, err := Interleave(ctx, perLevel, []func(context.Context) error{op})
		if err != nil {
			return r, err
		}
		r.Levels = append(r.Levels, HeldLevel{Held: n, Op: Summarize(ds[0])})
	}
	if n := len(releases); n > 0 {
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		r.BytesPerLease = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		r.AcquirePerLease = acquire / time.Duration(n)
	}
	return r, nil
}

// InterleaveN is Interleave for a Go benchmark: warmup untimed rounds, then
// b.N timed ones (the timer reset before and stopped after); an error fails
// b. It returns the timed durations of each op, indexed like ops.
func InterleaveN(ctx context.Context, b *testing.B, warmup int, ops []func(ctx context.Context) error) [][]time.Duration {
	b.Helper()
	if warmup > 0 {
		if _, err := Interleave(ctx, Budget{Max: warmup}, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	ds, err := Interleave(ctx, Budget{Max: b.N}, ops)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	return ds
}
