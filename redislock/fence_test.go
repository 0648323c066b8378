package redislock

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock/dlock/driver"
	"github.com/dlock/dlock/internal/redisscript"
)

// TestRaiseFence: RaiseFence makes the next grant's token exceed the value
// raised to, never lowers a counter, leaves the current holder's grant
// alone, raises only the kind asked for, and refuses a counter dlock did not
// write without touching it.
func TestRaiseFence(t *testing.T) {
	f := newFixture(t)
	ctx := ctxT(t)
	req := driver.AcquireRequest{Name: "raise", Owner: "o1", TTL: 5 * time.Second}
	g, err := f.d.TryAcquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.d.RaiseFence(ctx, "raise", driver.Exclusive, 100); err != nil {
		t.Fatal(err)
	}
	// The holder's grant is untouched: it renews and releases with its
	// token.
	if errs, err := f.d.Renew(ctx, []driver.Lease{lease(req, g)}); err != nil || errs[0] != nil {
		t.Fatalf("renew after raise: %v %v", errs, err)
	}
	if _, err := f.d.Release(ctx, lease(req, g)); err != nil {
		t.Fatalf("release after raise: %v", err)
	}
	g2, err := f.d.TryAcquire(ctx, req)
	if err != nil || g2.Token != 101 {
		t.Fatalf("grant after raise to 100: %+v, %v; want token 101", g2, err)
	}
	if _, err := f.d.Release(ctx, lease(req, g2)); err != nil {
		t.Fatal(err)
	}
	// Lower: no change.
	if err := f.d.RaiseFence(ctx, "raise", driver.Exclusive, 50); err != nil {
		t.Fatal(err)
	}
	g3, err := f.d.TryAcquire(ctx, req)
	if err != nil || g3.Token != 102 {
		t.Fatalf("grant after raise to 50: %+v, %v; want token 102", g3, err)
	}
	// Each kind has its own counter.
	for _, k := range []driver.Kind{driver.Read, driver.Write, driver.Permit} {
		if err := f.d.RaiseFence(ctx, "raise", k, 1000+uint64(k)); err != nil {
			t.Fatalf("%v: %v", k, err)
		}
	}
	for k, want := range map[driver.Kind]string{driver.Exclusive: "102", driver.Read: "1002", driver.Write: "1002", driver.Permit: "1003"} {
		if got := f.admin.Get(ctx, redisscript.FenceKey(DefaultKeyPrefix, "raise", k)).Val(); got != want {
			t.Errorf("%v counter = %q, want %q", k, got, want)
		}
	}
	// A counter dlock did not write is refused and left alone.
	fk := redisscript.FenceKey(DefaultKeyPrefix, "foreign", driver.Exclusive)
	f.admin.Set(ctx, fk, "not a counter", 0)
	if err := f.d.RaiseFence(ctx, "foreign", driver.Exclusive, 7); !errors.Is(err, redisscript.ErrForeignFence) {
		t.Fatalf("raise over a foreign counter: %v, want ErrForeignFence", err)
	}
	if got := f.admin.Get(ctx, fk).Val(); got != "not a counter" {
		t.Fatalf("foreign counter overwritten: %q", got)
	}
	if err := f.d.RaiseFence(ctx, "x", driver.Kind(9), 1); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("unknown kind: %v, want ErrUnsupported", err)
	}
}
