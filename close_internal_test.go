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
