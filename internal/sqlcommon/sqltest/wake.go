package sqltest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/dlock/dlock"
	"github.com/dlock/dlock/locktest"
)

// WakeFair measures, on drivers made by open (each like a separate
// process), what a waiter sees, and reports it as metrics (never asserts on
// timing):
//
//   - wake-p50-µs, wake-p99-µs: release → grant of one blocked waiter. A
//     holder on one driver holds for 20ms (a worker's hold, not a wait for
//     a condition: the waiter parks meanwhile), the waiter on another driver
//     is blocked in Lock; the release time is the midpoint of the Unlock.
//   - retake-share: 8 goroutines on 4 drivers loop Lock, 1ms hold, Unlock
//     for about 1.5s; the share of grants that went to the worker that had
//     held the lock just before.
//   - max-wait-ms, grants9: 9 contenders (3 drivers × 3 goroutines) each
//     holding ≈100ms for about 4s: the longest single Lock wait, and the
//     grants made.
//
// b.N scales the wake-up samples only (at least 20).
func WakeFair(b *testing.B, open Open) {
	ctx := context.Background()
	newClient := func() *dlock.Client {
		d, err := open(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: 30 * time.Second})
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	hold := func(d time.Duration) {
		t := time.NewTimer(d)
		<-t.C
	}

	// Wake-up.
	a, w := newClient(), newClient()
	name := RandomName("wake")
	var wakes []time.Duration
	for i := 0; i < max(b.N, 20); i++ {
		la, err := a.NewMutex(name, nil).TryLock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := w.NewMutex(name, nil).Lock(wctx)
			if err != nil {
				b.Error(err)
				close(got)
				return
			}
			at := time.Now()
			if err := l.Unlock(ctx); err != nil {
				b.Error(err)
			}
			got <- at
		}()
		hold(20 * time.Millisecond)
		t0 := time.Now()
		if err := la.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		rel := t0.Add(time.Since(t0) / 2)
		at, ok := <-got
		if !ok {
			b.FailNow()
		}
		wakes = append(wakes, max(at.Sub(rel), 0))
	}
	sort.Slice(wakes, func(i, j int) bool { return wakes[i] < wakes[j] })
	b.ReportMetric(float64(wakes[len(wakes)/2].Microseconds()), "wake-p50-µs")
	b.ReportMetric(float64(wakes[len(wakes)*99/100].Microseconds()), "wake-p99-µs")

	// Re-take share under 8 contenders.
	seq, _ := contend(b, []*dlock.Client{newClient(), newClient(), newClient(), newClient()}, 8, time.Millisecond, 1500*time.Millisecond)
	retakes := 0
	for i := 1; i < len(seq); i++ {
		if seq[i] == seq[i-1] {
			retakes++
		}
	}
	if len(seq) > 1 {
		b.ReportMetric(float64(retakes)/float64(len(seq)-1), "retake-share")
	}

	// Longest wait with 9 contenders holding ≈100ms.
	seq, maxWait := contend(b, []*dlock.Client{newClient(), newClient(), newClient()}, 9, 100*time.Millisecond, 4*time.Second)
	b.ReportMetric(float64(maxWait.Milliseconds()), "max-wait-ms")
	b.ReportMetric(float64(len(seq)), "grants9")
}

// contend runs workers goroutines (worker i on clients[i%len(clients)])
// that loop Lock, hold, Unlock on one name for about d (locktest.Fair),
// and returns the worker of each grant in grant order and the longest
// single Lock wait (a Lock still waiting at the end counts with its wait so
// far).
func contend(b *testing.B, clients []*dlock.Client, workers int, holdFor, d time.Duration) ([]int, time.Duration) {
	name := RandomName("contend")
	lockers := make([]locktest.LockFunc, workers)
	for i := range lockers {
		lockers[i] = locktest.MutexLocker(clients[i%len(clients)].NewMutex(name, nil))
	}
	r, err := locktest.Fair(context.Background(), d, holdFor, lockers)
	if err != nil {
		b.Error(err)
	}
	return r.Seq, r.MaxWait
}

// WakesOnRelease checks that a release wakes a blocked waiter: the holder
// (on one driver) holds with a one-minute TTL, the waiter (on another)
// polls at most once a minute (WaitMin = WaitMax = 1 minute), so only a
// wake-up from the backend can hand it the lock within the 20s allowed
// after the release.
func WakesOnRelease(t *testing.T, open Open) {
	ctx := context.Background()
	var cs []*dlock.Client
	for i := 0; i < 2; i++ {
		d, err := open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := dlock.New(d, &dlock.Options{TTL: time.Minute, WaitMin: time.Minute, WaitMax: time.Minute})
		defer c.Close()
		cs = append(cs, c)
	}
	name := RandomName("wakes")
	la, err := cs[0].NewMutex(name, nil).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	got := make(chan error, 1)
	waiting := make(chan struct{})
	go func() {
		m := cs[1].NewMutex(name, nil)
		if _, err := m.TryLock(wctx); !errors.Is(err, dlock.ErrLocked) {
			got <- fmt.Errorf("TryLock on the held lock: %v, want ErrLocked", err)
			return
		}
		close(waiting)
		l, err := m.Lock(wctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	select {
	case <-waiting:
	case err := <-got:
		t.Fatal(err)
	}
	// The holder holds on for a moment while the waiter enters Lock (its
	// first attempt fails, it subscribes, tries once more and waits). Had
	// the release come first, the waiter would simply take the lock.
	hold := time.NewTimer(300 * time.Millisecond)
	<-hold.C
	if err := la.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		t.Logf("waiter got the lock %v after the release", time.Since(released).Round(time.Microsecond))
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not get the lock within 20s of the release: no wake-up (its next poll is a minute away)")
	}
}

// OpenMode returns, for a package's tests, the driver opener of one mode
// on the test server (closed when tb ends).
type OpenMode func(tb testing.TB, mode string) Open

// WakeFairModes runs WakeFair per mode, as sub-benchmarks.
func WakeFairModes(b *testing.B, modes []string, open OpenMode) {
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) { WakeFair(b, open(b, mode)) })
	}
}

// WakesOnReleaseModes runs WakesOnRelease per mode, as subtests.
func WakesOnReleaseModes(t *testing.T, modes []string, open OpenMode) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { WakesOnRelease(t, open(t, mode)) })
	}
}

// NativePeer runs, per mode as sub-benchmarks, Ratio of TryLock+Unlock
// against what a user would write by hand instead (metric x-native). setup
// returns, for a mode and a fresh lock name, the Mutex and the hand-written
// lock-and-unlock of another name; b's cleanups close what it opens.
func NativePeer(b *testing.B, modes []string, setup func(b *testing.B, mode, name string) (*dlock.Mutex, func() error)) {
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) {
			m, native := setup(b, mode, RandomName("native"))
			Ratio(b, m, native, "x-native")
		})
	}
}
