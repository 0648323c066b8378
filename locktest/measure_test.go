package locktest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// chanLock is a lock for the measurement tests: a one-slot channel.
type chanLock chan struct{}

func (c chanLock) locker() LockFunc {
	return func(ctx context.Context) (func(context.Context) error, error) {
		select {
		case c <- struct{}{}:
			return func(context.Context) error { <-c; return nil }, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func TestSummarize(t *testing.T) {
	if s := Summarize(nil); s != (Stats{}) {
		t.Fatalf("Summarize(nil) = %+v", s)
	}
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Microsecond
	}
	s := Summarize(ds)
	if s.N != 100 || s.P50 != 51*time.Microsecond || s.P99 != 100*time.Microsecond || ds[0] != 100*time.Microsecond {
		t.Fatalf("Summarize = %+v (input changed: %v)", s, ds[0] != 100*time.Microsecond)
	}
}

// TestInterleaveShuffles: every round runs each op once, in an order that
// changes from round to round, so that every op comes right after each
// other one; an error stops it, naming the op.
func TestInterleaveShuffles(t *testing.T) {
	var order []int
	op := func(i int) func(context.Context) error {
		return func(context.Context) error { order = append(order, i); return nil }
	}
	const rounds = 300
	ds, err := Interleave(context.Background(), Budget{Max: rounds}, []func(context.Context) error{op(0), op(1), op(2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 3*rounds {
		t.Fatalf("%d runs, want %d", len(order), 3*rounds)
	}
	after := map[[2]int]int{} // [previous op, op] -> times
	for r := 0; r < rounds; r++ {
		seen := map[int]bool{}
		for _, i := range order[3*r : 3*r+3] {
			seen[i] = true
		}
		if len(seen) != 3 {
			t.Fatalf("round %d ran %v, want each op once", r, order[3*r:3*r+3])
		}
	}
	for k := 1; k < len(order); k++ {
		after[[2]int{order[k-1], order[k]}]++
	}
	for a := range 3 {
		for b := range 3 {
			if a != b && after[[2]int{a, b}] < rounds/6 {
				t.Fatalf("op %d came right after op %d %d times in %d rounds: the order does not mix (%v)", b, a, after[[2]int{a, b}], rounds, after)
			}
		}
	}
	for i, d := range ds {
		if len(d) != rounds {
			t.Fatalf("op %d: %d samples, want %d", i, len(d), rounds)
		}
	}
	// An op that slows whatever runs right after it (work it leaves behind
	// on a shared server) slows each other op only in some rounds, not at
	// its median: with a fixed order its successor paid for it every time.
	const cost = 2 * time.Millisecond
	spill := false
	heavy := func(context.Context) error { spill = true; return nil }
	victim := func(context.Context) error {
		if spill {
			spill = false
			time.Sleep(cost) // the simulated cost of a server still busy
		}
		return nil
	}
	ds, err = Interleave(context.Background(), Budget{Max: 200}, []func(context.Context) error{heavy, victim, victim, victim})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if p := Summarize(ds[i]).P50; p >= cost {
			t.Fatalf("op %d, one of three after a heavy op: p50 %v, the heavy op's spill", i, p)
		}
	}
	boom := errors.New("boom")
	_, err = Interleave(context.Background(), Budget{Max: 3}, []func(context.Context) error{op(0), func(context.Context) error { return boom }})
	if !errors.Is(err, boom) || err.Error() != "op 1: boom" {
		t.Fatalf("err %v, want op 1: boom", err)
	}
	// No bound: one round.
	if ds, _ := Interleave(context.Background(), Budget{}, []func(context.Context) error{op(0)}); len(ds[0]) != 1 {
		t.Fatalf("empty budget: %d samples, want 1", len(ds[0]))
	}
}

// TestInterleavePrimed: every timed run of an op follows an untimed run of
// the same op, and only the second is timed.
func TestInterleavePrimed(t *testing.T) {
	var order []int
	calls := 0
	op := func(i int) func(context.Context) error {
		return func(context.Context) error {
			order = append(order, i)
			calls++
			if calls%2 == 1 {
				time.Sleep(100 * time.Millisecond) // the priming run's cost, which must not be counted
			}
			return nil
		}
	}
	ds, err := InterleavePrimed(context.Background(), Budget{Max: 2}, []func(context.Context) error{op(0), op(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 8 || order[0] != order[1] || order[2] != order[3] || order[4] != order[5] || order[6] != order[7] ||
		order[0] == order[2] || order[4] == order[6] {
		t.Fatalf("order %v, want each op twice in a row (primed, then timed), each once per round", order)
	}
	for i, d := range ds {
		if len(d) != 2 {
			t.Fatalf("op %d: %d samples, want 2", i, len(d))
		}
		for _, x := range d {
			if x >= 100*time.Millisecond {
				t.Fatalf("op %d: timed %v: the priming run was counted", i, x)
			}
		}
	}
}

// TestInterleaveBlocks: each op runs in blocks of back-to-back runs whose
// first is untimed, blocks rotate, and an op that slows the next few runs
// of whatever follows it (a shared server still busy) does not move the
// other op's median, as it does under InterleavePrimed.
func TestInterleaveBlocks(t *testing.T) {
	var order []int
	op := func(i int) func(context.Context) error {
		return func(context.Context) error {
			order = append(order, i)
			return nil
		}
	}
	ds, err := InterleaveBlocks(context.Background(), Budget{Max: 2}, 0, []func(context.Context) error{op(0), op(1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 8 || order[0] != order[1] || order[2] != order[3] || order[4] != order[5] || order[6] != order[7] ||
		order[0] == order[2] || order[4] == order[6] {
		t.Fatalf("order %v, want blocks of two runs (untimed, then timed), each op once per round", order)
	}
	if len(ds[0]) != 2 || len(ds[1]) != 2 {
		t.Fatalf("samples %d and %d, want 2 each (one timed run per zero-length block)", len(ds[0]), len(ds[1]))
	}

	const spill, cost = 3, 20 * time.Millisecond
	var after int // runs of the victim still slowed by the heavy op
	heavy := func(context.Context) error { after = spill; return nil }
	victim := func(context.Context) error {
		if after > 0 {
			after--
			time.Sleep(cost) // the simulated cost of sharing a busy server
		}
		return nil
	}
	ops := []func(context.Context) error{heavy, victim}
	ds, err = InterleaveBlocks(context.Background(), Budget{Max: 4}, 50*time.Millisecond, ops)
	if err != nil {
		t.Fatal(err)
	}
	if p := Summarize(ds[1]).P50; p >= cost {
		t.Fatalf("blocks: victim p50 %v over %d samples: the heavy op's spill reached the median", p, len(ds[1]))
	}
	// The same pair under InterleavePrimed: the spill outlasts the priming
	// run, so the victim's median is the spill (the case blocks are for).
	ds, err = InterleavePrimed(context.Background(), Budget{Max: 4}, ops)
	if err != nil {
		t.Fatal(err)
	}
	if p := Summarize(ds[1]).P50; p < cost {
		t.Fatalf("primed: victim p50 %v, want the spill's %v (the model is wrong)", p, cost)
	}
}

// TestHotLockCounts: Max bounds the grants, every hand-off is measured, and
// an empty Budget takes one grant rather than running forever.
func TestHotLockCounts(t *testing.T) {
	l := make(chanLock, 1)
	lockers := []LockFunc{l.locker(), l.locker(), l.locker()}
	r, err := HotLock(context.Background(), Budget{Max: 200}, lockers)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops < 200 || r.Ops > 200+len(lockers) || len(r.Handoffs) != r.Ops-1 || r.Retakes > r.Ops-1 || r.OpsPerSec() <= 0 {
		t.Fatalf("result %+v", r)
	}
	done := make(chan HotResult, 1)
	go func() {
		r, _ := HotLock(context.Background(), Budget{}, lockers)
		done <- r
	}()
	select {
	case r := <-done:
		if r.Ops < 1 || r.Ops > len(lockers) {
			t.Fatalf("empty budget: %d grants, want 1 (or one per goroutine already granted)", r.Ops)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("HotLock with an empty Budget did not return")
	}
}

// TestHotLockRetakes: a lock that always goes back to the same goroutine
// is all re-takes.
func TestHotLockRetakes(t *testing.T) {
	l := make(chanLock, 1)
	block := func(ctx context.Context) (func(context.Context) error, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r, err := HotLock(context.Background(), Budget{Max: 50}, []LockFunc{l.locker(), block})
	if err != nil {
		t.Fatal(err)
	}
	if r.RetakeShare() != 1 {
		t.Fatalf("re-take share %v, want 1 (%+v)", r.RetakeShare(), r)
	}
}

// TestFair: every grant is counted for its goroutine, a goroutine that
// never gets the lock has its wait until the end counted, and a Lock's
// error other than running out of time fails the run.
func TestFair(t *testing.T) {
	l := make(chanLock, 1)
	r, err := Fair(context.Background(), 200*time.Millisecond, time.Millisecond, []LockFunc{l.locker(), l.locker()})
	if err != nil {
		t.Fatal(err)
	}
	per := r.PerGoroutine(2)
	if len(r.Seq) < 2 || per[0]+per[1] != len(r.Seq) || len(r.Waits) != len(r.Seq) || r.RetakeShare() < 0 || r.RetakeShare() > 1 {
		t.Fatalf("result %+v, per goroutine %v", r, per)
	}
	// The second goroutine's lock is held for good by someone else: it
	// waits until fairGrace past the end, and that wait is the longest.
	defer func(g time.Duration) { fairGrace = g }(fairGrace)
	fairGrace = time.Second
	held := make(chanLock, 1)
	held <- struct{}{}
	start := time.Now()
	r, err = Fair(context.Background(), 100*time.Millisecond, time.Millisecond, []LockFunc{l.locker(), held.locker()})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); r.MaxWait < fairGrace || r.MaxWait > took {
		t.Fatalf("longest wait %v in a run of %v; want the starved goroutine's, at least %v", r.MaxWait, took, fairGrace)
	}
	if per := r.PerGoroutine(2); per[0] == 0 || per[1] != 0 {
		t.Fatalf("grants per goroutine %v: want some for the first, none for the second", per)
	}
	bad := func(ctx context.Context) (func(context.Context) error, error) { return nil, errors.New("refused") }
	if _, err := Fair(context.Background(), time.Second, time.Millisecond, []LockFunc{bad}); err == nil {
		t.Fatal("Fair ignored a Lock's error")
	}
}

func TestWake(t *testing.T) {
	l := make(chanLock, 1)
	ds, err := Wake(context.Background(), Budget{Max: 3}, time.Millisecond, l.locker(), l.locker())
	if err != nil || len(ds) != 3 {
		t.Fatalf("Wake: %v samples, err %v", len(ds), err)
	}
	// A "waiter" that is granted while the holder holds is an error.
	free := func(ctx context.Context) (func(context.Context) error, error) {
		return func(context.Context) error { return nil }, nil
	}
	if _, err := Wake(context.Background(), Budget{Max: 1}, time.Second, l.locker(), free); err == nil {
		t.Fatal("Wake accepted a waiter granted while the lock was held")
	}
}

// TestManyHeld: the levels are measured in order and every lock taken is
// released, also when taking one fails.
func TestManyHeld(t *testing.T) {
	var held atomic.Int64
	hold := func(ctx context.Context, i int) (func(context.Context) error, error) {
		if i == 250 {
			return nil, errors.New("full")
		}
		held.Add(1)
		return func(context.Context) error { held.Add(-1); return nil }, nil
	}
	op := func(context.Context) error { return nil }
	r, err := ManyHeld(context.Background(), []int{0, 10, 100}, Budget{Max: 5}, op, hold)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Levels) != 3 || r.Levels[2].Held != 100 || r.Levels[2].Op.N != 5 || held.Load() != 0 {
		t.Fatalf("result %+v, %d still held", r, held.Load())
	}
	r, err = ManyHeld(context.Background(), []int{0, 1000}, Budget{Max: 1}, op, hold)
	if !errors.Is(err, ErrHold) || len(r.Levels) != 1 || held.Load() != 0 {
		t.Fatalf("err %v, levels %+v, %d still held; want ErrHold, level 0 and all released", err, r.Levels, held.Load())
	}
}

// lapsed is a context whose deadline has passed but whose timer has not
// fired yet (Err is nil), as a loaded machine can show for a moment.
type lapsed struct{ context.Context }

func (lapsed) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestTimeoutAtDeadlineIsNoFailure: a Lock that fails for its deadline
// (an I/O timeout set from it) before the context's own timer has fired
// ran out of time; HotLock and Fair do not report it as an error. (The peer
// harness dropped dlock's hot-lock figures once for such a Lock.)
func TestTimeoutAtDeadlineIsNoFailure(t *testing.T) {
	timeout := func(context.Context) (func(context.Context) error, error) {
		return nil, errors.New("write tcp: i/o timeout")
	}
	ctx := lapsed{context.Background()}
	if _, err := HotLock(ctx, Budget{Max: 1}, []LockFunc{timeout}); err != nil {
		t.Errorf("HotLock: %v, want no error", err)
	}
	if _, err := Fair(ctx, time.Second, time.Millisecond, []LockFunc{timeout}); err != nil {
		t.Errorf("Fair: %v, want no error", err)
	}
	// A failure before the deadline is still one.
	if _, err := HotLock(context.Background(), Budget{Max: 1}, []LockFunc{timeout}); err == nil {
		t.Error("HotLock: no error for a Lock that failed before any deadline")
	}
}
