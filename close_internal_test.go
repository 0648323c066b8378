package dlock

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/dlock/dlock/internal/testwait"
)

// A context a driver derives from a closingCtx (a waiting Lock's, when the
// caller's is never cancelled) ends when the Client closes, without a
// goroutine started to watch it.
func TestClosingCtxDerived(t *testing.T) {
	c := &Client{}
	c.closeCtx, c.stopCtx = context.WithCancel(context.Background())
	x := &closingCtx{Context: context.WithValue(context.Background(), t, "v"), c: c}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(x, time.Hour)
	defer cancel()
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("deriving a context started %d goroutines", n-before)
	}
	if ctx.Value(t) != "v" {
		t.Fatal("the derived context lost the caller's values")
	}
	c.stopCtx()
	testwait.Until(t, 5*time.Second, "the derived context to end", func() bool { return ctx.Err() != nil })
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("Err = %v, want context.Canceled", ctx.Err())
	}
}

// A detached context ends at its deadline whether or not Done was asked for
// first, ends Canceled on stop, keeps the caller's values but not its
// cancellation, and takes the contexts derived from it along without a
// goroutine each.
func TestDetachedCtx(t *testing.T) {
	c := &Client{opts: Options{ReleaseTimeout: 50 * time.Millisecond}}
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), t, "v"))
	cancelParent()

	x := c.detached(parent)
	if x.Err() != nil || x.Value(t) != "v" {
		t.Fatalf("fresh: Err %v, value %v", x.Err(), x.Value(t))
	}
	if d, ok := x.Deadline(); !ok || time.Until(d) > 50*time.Millisecond {
		t.Fatalf("Deadline = %v, %v", d, ok)
	}
	testwait.Until(t, 5*time.Second, "Err after the deadline (Done never asked for)", func() bool { return x.Err() != nil })
	if !errors.Is(x.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", x.Err())
	}
	select {
	case <-x.Done():
	default:
		t.Fatal("Done asked for after the end is not closed")
	}
	x.stop()
	if !errors.Is(x.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err after stop = %v, want DeadlineExceeded still", x.Err())
	}

	x = c.detached(parent)
	done := x.Done()
	before := runtime.NumGoroutine()
	child, cancelChild := context.WithCancel(x)
	defer cancelChild()
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("deriving a context started %d goroutines", n-before)
	}
	testwait.Until(t, 5*time.Second, "Done at the deadline", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	testwait.Until(t, 5*time.Second, "the derived context to end", func() bool { return child.Err() != nil })
	if !errors.Is(x.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(x), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, Cause = %v, want DeadlineExceeded", x.Err(), context.Cause(x))
	}

	c.opts.ReleaseTimeout = time.Hour
	x = c.detached(context.Background())
	child, cancelChild = context.WithTimeout(x, time.Hour)
	defer cancelChild()
	ran := make(chan struct{})
	stopF := context.AfterFunc(x, func() { close(ran) })
	x.stop()
	if !errors.Is(x.Err(), context.Canceled) {
		t.Fatalf("Err after stop = %v, want Canceled", x.Err())
	}
	testwait.Until(t, 5*time.Second, "the derived context to end on stop", func() bool { return child.Err() != nil })
	<-ran
	if stopF() {
		t.Fatal("AfterFunc's stop reports it stopped a function that ran")
	}

	x = c.detached(context.Background())
	stopF = context.AfterFunc(x, func() { t.Error("a stopped AfterFunc ran") })
	if !stopF() {
		t.Fatal("AfterFunc's stop did not stop it")
	}
	x.stop()
}
