// Package testwait is the one poll-with-a-deadline loop of dlock's tests: a
// test waits on the condition it cares about, never on a fixed sleep.
package testwait

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Interval is how often Until polls. Inside a testing/synctest bubble the
// polls run on the bubble's fake clock.
const Interval = 5 * time.Millisecond

// Until polls cond every Interval until it holds, and fails t (naming what)
// if it does not within within.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(Interval)
	}
}

// EndsWithDeadline calls f with a context that ends after wait, and fails t
// (naming what) unless f returns an error wrapping
// context.DeadlineExceeded within wait+slack: a call that must give up
// when its context ends, and do so promptly.
func EndsWithDeadline(t testing.TB, wait, slack time.Duration, what string, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: %v, want the context's deadline", what, err)
	}
	if took > wait+slack {
		t.Errorf("%s, with a %v context, returned after %v (slack %v)", what, wait, took, slack)
	}
}

// Outcome is what a call run by Go returned, and when it returned.
type Outcome[T any] struct {
	V   T
	Err error
	At  time.Time
}

// Go runs f on a goroutine of its own and delivers its outcome on the
// returned channel (buffered: the goroutine never blocks on it).
func Go[T any](f func() (T, error)) <-chan Outcome[T] {
	out := make(chan Outcome[T], 1)
	go func() {
		v, err := f()
		out <- Outcome[T]{V: v, Err: err, At: time.Now()}
	}()
	return out
}
