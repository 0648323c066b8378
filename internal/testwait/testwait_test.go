package testwait

import (
	"context"
	"errors"
	"testing"
	"time"
)

type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(string, ...any) {
	r.failed = true
	panic(r) // stop the loop as Fatalf's Goexit would
}

func TestUntil(t *testing.T) {
	n := 0
	Until(t, time.Second, "third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	r := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		Until(r, 20*time.Millisecond, "never", func() bool { return false })
	}()
	if !r.failed {
		t.Fatal("Until did not fail on a condition that never held")
	}
}

// errRecorder records Errorf.
type errRecorder struct {
	testing.TB
	errs int
}

func (r *errRecorder) Helper()               {}
func (r *errRecorder) Errorf(string, ...any) { r.errs++ }

func TestEndsWithDeadline(t *testing.T) {
	waitDone := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	r := &errRecorder{TB: t}
	EndsWithDeadline(r, 10*time.Millisecond, time.Second, "waits for ctx", waitDone)
	if r.errs != 0 {
		t.Errorf("%d failures for a call that ended with its context", r.errs)
	}
	r = &errRecorder{TB: t}
	EndsWithDeadline(r, 10*time.Millisecond, time.Second, "fails at once", func(context.Context) error { return errors.New("boom") })
	if r.errs != 1 {
		t.Errorf("%d failures for a call that returned another error, want 1", r.errs)
	}
	r = &errRecorder{TB: t}
	EndsWithDeadline(r, 10*time.Millisecond, 10*time.Millisecond, "outlasts ctx", func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // a call that returns late: what is measured
		return ctx.Err()
	})
	if r.errs != 1 {
		t.Errorf("%d failures for a call that returned 40 ms past its slack, want 1", r.errs)
	}
}

func TestGo(t *testing.T) {
	before := time.Now()
	o := <-Go(func() (int, error) { return 7, errors.New("e") })
	if o.V != 7 || o.Err == nil || o.Err.Error() != "e" || o.At.Before(before) {
		t.Fatalf("outcome %+v", o)
	}
}
